"""Pattern 1: a bare ``@ray.remote`` whose callers are all remote already is a no-op: remove it.

Before (Ray)::

    @ray.remote
    def normalize(text: str) -> str:
        return " ".join(text.lower().split())

    @ray.remote
    def process_shard(lines):
        return ray.get([normalize.remote(line) for line in lines])   # a task per line, inside a task

After (Fray): ``normalize`` is a plain function called in-process; only the outer unit of work (if
anything) is scheduled, here with the job context.
"""

from __future__ import annotations

from fray_core import fray_job_ctx


def normalize(text: str) -> str:
    return " ".join(text.lower().split())


def process_shard(lines: list[str]) -> list[str]:
    return [normalize(line) for line in lines]  # a plain call: no task, no serialization


def main() -> None:
    shards = [["Hello   World", "FRAY  is here"], ["One more  LINE"]]
    ctx = fray_job_ctx()
    results = ctx.get([ctx.run(process_shard, shard) for shard in shards])
    print(f"normalized: {results}")


if __name__ == "__main__":
    main()
