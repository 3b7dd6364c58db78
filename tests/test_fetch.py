"""`quantmatrix fetch` against a local fake cache: huggingface_hub.snapshot_download is replaced by a function that
writes the hub cache layout (refs/<revision> -> snapshots/<commit>/...), as no hub is reachable from these tests.
What is checked is the real part: what gets asked for, and that the plugin's resolver then finds it offline."""

from __future__ import annotations

import re
from pathlib import Path

import huggingface_hub
import pytest
from matrixkit import SMALL, write

from quantmatrix import cli
from quantmatrix.checkpoints import fetch, store
from quantmatrix.errors import CheckpointUnavailable
from quantmatrix.schema.load import load

ROOT = Path(__file__).resolve().parents[1]
PINNED = "89abcdef0123456789abcdef0123456789abcdef"
TWO_HUB = SMALL.replace(
    "version: 1\n", "version: 1\nallow_floating_revisions: true  # `main` on purpose\n", 1).replace(
    "    source: {synthetic: {model: qwen3_moe}}\n    producer: modelopt\n    scheme: nvfp4_weight_only\n",
    "    source: {hub: org/wo-nvfp4, revision: main}\n    producer: modelopt\n    scheme: nvfp4_weight_only\n"
    "    size_gb: 2\n",
).replace(
    "    source: {synthetic: {model: qwen3_moe}}\n    producer: modelopt\n    scheme: nvfp4_w4a4\n",
    f"    source: {{hub: org/w4a4-nvfp4, revision: {PINNED}}}\n    producer: modelopt\n    scheme: nvfp4_w4a4\n",
)


class FakeHub:
    """snapshot_download as far as the cache layout goes; `fail` names repos whose download raises."""

    def __init__(self, fail: tuple[str, ...] = ()) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.fail = fail

    def snapshot_download(self, repo_id: str, revision: str, cache_dir: str,
                          allow_patterns: list[str] | None = None) -> str:
        self.calls.append((repo_id, revision, cache_dir) if allow_patterns is None else
                          (repo_id, revision, cache_dir, tuple(allow_patterns)))
        if repo_id in self.fail:
            raise OSError(f"faked: {repo_id} unreachable")
        commit = revision if re.fullmatch(r"[0-9a-f]{40}", revision) else "f" * 40
        base = Path(cache_dir) / f"models--{repo_id.replace('/', '--')}"
        snap = base / "snapshots" / commit
        snap.mkdir(parents=True)
        (snap / "config.json").write_text("{}")
        if allow_patterns is None or "*.safetensors" in allow_patterns:
            (snap / "model.safetensors").write_bytes(b"\0" * 8)
        if revision != commit:
            (base / "refs").mkdir(exist_ok=True)
            (base / "refs" / revision).write_text(commit)
        return str(snap)


@pytest.fixture
def hub(tmp_path, monkeypatch) -> FakeHub:
    fake = FakeHub()
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake.snapshot_download)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return fake


@pytest.fixture
def matrix_file(tmp_path) -> Path:
    assert "org/wo-nvfp4" in TWO_HUB and "org/w4a4-nvfp4" in TWO_HUB
    return write(tmp_path, TWO_HUB)


def test_fetch_downloads_what_is_missing_and_the_resolver_finds_it_with_snapshot_download_faked(
        hub, matrix_file, tmp_path, capsys):
    """Each absent checkpoint is asked for at its revision into the cache the plugin reads; afterwards the
    plugin's resolver finds both, a branch through refs/ and a pinned commit directly."""
    assert cli.main(["fetch", "--matrix", str(matrix_file)]) == 0
    cache = str(tmp_path / "hub")
    assert hub.calls == [("org/wo-nvfp4", "main", cache), ("org/w4a4-nvfp4", PINNED, cache)]
    assert store.resolve_hub("org/wo-nvfp4", "main").name == "f" * 40
    assert store.resolve_hub("org/w4a4-nvfp4", PINNED).name == PINNED
    assert "2 of 2 downloaded" in capsys.readouterr().out


def test_fetch_skips_what_is_cached_with_snapshot_download_faked(hub, matrix_file, capsys):
    """A second run asks for nothing and says where each checkpoint already is."""
    assert cli.main(["fetch", "--matrix", str(matrix_file)]) == 0
    hub.calls.clear()
    capsys.readouterr()
    assert cli.main(["fetch", "--matrix", str(matrix_file)]) == 0
    assert hub.calls == []
    out = capsys.readouterr().out
    assert "tiny-wo: org/wo-nvfp4@main, 2 GB, cached at" in out and "0 of 2 not in" in out


def test_fetch_only_takes_the_named_checkpoints_with_snapshot_download_faked(hub, matrix_file):
    assert cli.main(["fetch", "--matrix", str(matrix_file), "--only", "tiny-w4a4"]) == 0
    assert [c[0] for c in hub.calls] == ["org/w4a4-nvfp4"]


def test_a_failed_download_is_reported_and_the_rest_still_fetched_with_snapshot_download_faked(
        hub, matrix_file, capsys):
    """Exit 1, naming the checkpoint and the error; the other checkpoint is still downloaded."""
    hub.fail = ("org/wo-nvfp4",)
    assert cli.main(["fetch", "--matrix", str(matrix_file)]) == 1
    assert [c[0] for c in hub.calls] == ["org/wo-nvfp4", "org/w4a4-nvfp4"]
    captured = capsys.readouterr()
    assert "tiny-wo: OSError: faked: org/wo-nvfp4 unreachable" in captured.err
    assert "1 of 2 downloaded, 1 failed" in captured.out


def test_dry_run_prints_every_download_line_of_real_yaml_and_downloads_nothing(hub, capsys):
    """On an empty cache, --dry-run over matrices/real.yaml prints the `hf download` line of every checkpoint
    (the same line a skipped case names) and the known download size, without calling the hub."""
    assert cli.main(["fetch", "--matrix", str(ROOT / "matrices" / "real.yaml"), "--dry-run", "--gpus", "8"]) == 0
    assert hub.calls == []
    out = capsys.readouterr().out
    real = load(ROOT / "matrices" / "real.yaml")
    for c in real.checkpoints:
        assert f"\n{store.download_command(*c.source.value)}\n" in f"\n{out}"
    known = sum(c.size_gb for c in real.checkpoints if c.size_gb)
    unknown = sum(1 for c in real.checkpoints if c.size_gb is None)
    n = len(real.checkpoints)
    tail = f", plus {unknown} of unknown size" if unknown else ""
    assert f"{n} of {n} not in {store.hub_cache()}: about {known:g} GB to download{tail}\n" in out


def test_a_runner_with_too_few_gpus_fetches_only_the_config_files_with_snapshot_download_faked(
        hub, tmp_path, capsys):
    """A checkpoint needing 2 GPUs on a 1-GPU runner: only its config files are asked for (its config checks run
    here; its weights would only fill the disk); the config-level resolver finds that snapshot, the full one
    does not. The one-GPU checkpoint is fetched whole."""
    path = write(tmp_path, TWO_HUB.replace("    size_gb: 2\n", "    size_gb: 2\n    gpus: 2\n"))
    assert cli.main(["fetch", "--matrix", str(path), "--gpus", "1", "--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert "tiny-wo: org/wo-nvfp4@main, config files only (needs 2 GPUs, this runner has 1), not cached" in dry
    assert "hf download org/wo-nvfp4 --revision main --include '*.json' --include '*.txt'" in dry
    assert "about 0 GB to download" in dry
    assert cli.main(["fetch", "--matrix", str(path), "--gpus", "1"]) == 0
    cache = str(tmp_path / "hub")
    assert hub.calls == [("org/wo-nvfp4", "main", cache, store.CONFIG_PATTERNS), ("org/w4a4-nvfp4", PINNED, cache)]
    assert store.resolve_hub("org/wo-nvfp4", "main", configs_only=True).name == "f" * 40
    with pytest.raises(CheckpointUnavailable, match="only partly in the local Hugging Face cache"):
        store.resolve_hub("org/wo-nvfp4", "main")


def test_fetch_is_a_quantmatrix_subcommand(hub, matrix_file, capsys):
    assert cli.main(["fetch", "--matrix", str(matrix_file), "--dry-run"]) == 0
    assert "hf download org/wo-nvfp4 --revision main" in capsys.readouterr().out


def test_fetch_refuses_to_start_offline(hub, matrix_file, monkeypatch, capsys):
    """HF_HUB_OFFLINE (set for test runs) would make every download fail: refused up front, saying so."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert cli.main(["fetch", "--matrix", str(matrix_file)]) == 2
    assert hub.calls == []
    assert "HF_HUB_OFFLINE is set" in capsys.readouterr().err


def test_fetch_refuses_to_start_without_the_disk_space_with_free_space_faked(hub, matrix_file, monkeypatch,
                                                                              capsys):
    """The known sizes are checked against the free space of the cache's disk before any download starts."""
    monkeypatch.setattr(fetch, "_free_bytes", lambda path: 1_000_000_000)
    assert cli.main(["fetch", "--matrix", str(matrix_file)]) == 2
    assert hub.calls == []
    assert "need about 2 GB but" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "fragment"), [
    (["--only", "tiny-w0"], "has no checkpoint 'tiny-w0' (did you mean 'tiny-wo'?)"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_usage_errors_exit_2(hub, matrix_file, capsys, args, fragment):
    assert cli.main(["fetch", "--matrix", str(matrix_file), *args]) == 2
    assert fragment in capsys.readouterr().err


def test_a_matrix_without_hub_checkpoints_has_nothing_to_fetch(hub, tmp_path, capsys):
    assert cli.main(["fetch", "--matrix", str(write(tmp_path, SMALL)), "--only", "tiny-wo"]) == 2
    assert "a synthetic checkpoint" in capsys.readouterr().err
    assert cli.main(["fetch", "--matrix", str(write(tmp_path, SMALL))]) == 2
    assert "has no hub checkpoints: nothing to fetch" in capsys.readouterr().err
