"""Red when the nightly has gone quiet: exit 1 when no run of nightly.yml completed (a conclusion other than
cancelled or skipped) within the last N hours (default 26), so a schedule that stopped firing, a runner queue that
holds every night, or nights all cancelled are noticed. Standard library only.

    gh run list --workflow nightly.yml --limit 50 --json databaseId,status,conclusion,createdAt,updatedAt \
      | python3 nightly_fresh.py [--hours 26] [--now ISO-8601]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

NOT_A_NIGHT = {"cancelled", "skipped", "stale", "startup_failure"}


def _time(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def verdict(runs: list[dict], now: datetime.datetime, hours: float) -> tuple[bool, str]:
    """(fresh, in words) from `gh run list`'s JSON."""
    done = [r for r in runs if r.get("status") == "completed" and r.get("conclusion") not in NOT_A_NIGHT]
    if not done:
        return False, f"no nightly run completed among the last {len(runs)} runs"
    last = max(done, key=lambda r: _time(r["updatedAt"]))
    age = (now - _time(last["updatedAt"])).total_seconds() / 3600
    said = f"the last completed nightly is run {last['databaseId']} ({last['conclusion']}), {age:.1f} h ago"
    return age <= hours, said


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=26.0)
    parser.add_argument("--now", help="the time to judge at (default: now, UTC)")
    args = parser.parse_args(argv)
    now = _time(args.now) if args.now else datetime.datetime.now(datetime.timezone.utc)
    fresh, said = verdict(json.load(sys.stdin), now, args.hours)
    print(said if fresh else f"::error::the nightly is stale: {said} (more than {args.hours:g} h)")
    return 0 if fresh else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
