"""Synthetic checkpoints are content-addressed and written atomically; hub ids come from the local cache only."""

from __future__ import annotations

import json

import pytest
from matrixkit import write

from quantmatrix.checkpoints import store
from quantmatrix.errors import CheckpointUnavailable
from quantmatrix.schema.load import load


@pytest.fixture
def matrix(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTMATRIX_CACHE", str(tmp_path / "cache"))
    return load(write(tmp_path))


def test_same_spec_same_directory_and_a_changed_spec_a_new_one(matrix):
    """The cache key is the spec's content: asking twice reuses, a different scheme gets its own directory."""
    wo, w4a4 = matrix.checkpoints
    first = store.materialize(wo)
    assert store.materialize(wo) == first
    assert store.materialize(w4a4) != first
    group = json.loads((first / "config.json").read_text())["quantization_config"]["config_groups"]["group_0"]
    assert group["input_activations"] is None


def test_a_killed_build_leaves_nothing_a_later_run_trusts(matrix, monkeypatch):
    """If writing dies midway, no directory appears; a half-written leftover is rebuilt, not used."""
    wo = matrix.checkpoints[0]

    def die(spec, out):
        (out / "config.json").write_text("{")
        raise KeyboardInterrupt

    monkeypatch.setattr(store, "write", die)
    with pytest.raises(KeyboardInterrupt):
        store.materialize(wo)
    root = store.cache_root() / "checkpoints"
    assert list(root.iterdir()) == []
    monkeypatch.undo()
    monkeypatch.setenv("QUANTMATRIX_CACHE", str(root.parent))
    final = root / f"{wo.id}-{store.digest(store.spec_of(wo))[:16]}"
    final.mkdir()
    (final / "config.json").write_text("{")  # a leftover without the completion marker
    assert store.materialize(wo) == final
    assert json.loads((final / "config.json").read_text())["model_type"] == "qwen3_moe"


def test_hub_checkpoint_absent_from_local_cache_says_how_to_get_it(tmp_path, monkeypatch):
    """A hub id not in the HF cache is unavailable, with the exact download command for a host with access."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(CheckpointUnavailable, match="hf download example-org/tiny-moe-nvfp4 "
                                                    "--revision main"):
        store.resolve_hub("example-org/tiny-moe-nvfp4", "main")


def test_hub_checkpoint_is_found_in_a_fake_local_cache(tmp_path, monkeypatch):
    """The huggingface_hub cache layout (refs/<rev> -> snapshots/<commit>) is followed without any network."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    base = tmp_path / "hub" / "models--example-org--tiny-moe-nvfp4"
    commit = "a" * 40
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(commit)
    (base / "snapshots" / commit).mkdir(parents=True)
    (base / "snapshots" / commit / "config.json").write_text("{}")
    (base / "snapshots" / commit / "model.safetensors").write_bytes(b"")
    assert store.resolve_hub("example-org/tiny-moe-nvfp4", "main") == base / "snapshots" / commit


def test_a_snapshot_missing_shards_is_not_cached_and_says_how_to_resume(tmp_path, monkeypatch):
    """An interrupted download leaves config.json and some shards: the snapshot is not counted as cached (no
    test silently reads half a model), and the message names a missing shard and the command that resumes it.
    A snapshot with config.json and no weight file at all is incomplete too."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    snap = tmp_path / "hub" / "models--example-org--tiny-moe-nvfp4" / "snapshots" / ("b" * 40)
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    with pytest.raises(CheckpointUnavailable, match="1 weight file.s. missing, e.g. model.safetensors"):
        store.resolve_hub("example-org/tiny-moe-nvfp4", "b" * 40)
    shards = {f"w{i}": f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)}
    (snap / "model.safetensors.index.json").write_text(json.dumps({"weight_map": shards}))
    (snap / "model-00001-of-00003.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointUnavailable, match=r"2 weight file\(s\) missing, e.g. model-00002-of-00003"
                                                    r".*hf download example-org/tiny-moe-nvfp4 --revision b{40} "
                                                    "again to resume"):
        store.resolve_hub("example-org/tiny-moe-nvfp4", "b" * 40)
    for name in shards.values():
        (snap / name).write_bytes(b"")
    assert store.resolve_hub("example-org/tiny-moe-nvfp4", "b" * 40) == snap


@pytest.mark.parametrize("edit", ["changed", "added", "removed"])
def test_an_entry_edited_in_place_is_rebuilt_not_used(matrix, edit):
    """The cache outlives the night and a job can write it: an entry whose files no longer hold the bytes its
    build recorded (a tensor file changed, a file added or removed) is built again, byte for byte as before."""
    wo = matrix.checkpoints[0]
    entry = store.materialize(wo)
    clean = (entry / "model.safetensors").read_bytes()
    if edit == "changed":
        (entry / "model.safetensors").write_bytes(clean[:-1] + bytes([clean[-1] ^ 1]))
    elif edit == "added":
        (entry / "sitecustomize.py").write_text("import os\n")
    else:
        (entry / "generation_config.json").unlink()
    assert store.materialize(wo) == entry
    assert (entry / "model.safetensors").read_bytes() == clean
    assert (entry / "generation_config.json").is_file() and not (entry / "sitecustomize.py").exists()
