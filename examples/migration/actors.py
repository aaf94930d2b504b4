"""Pattern 6: Ray actors become ``fray_job_ctx().create_actor``.

Before (Ray)::

    @ray.remote
    class StatusActor:
        def __init__(self): self.status = {}
        def set(self, step, status): self.status[step] = status
        def get(self, step): return self.status.get(step)

    actor = StatusActor.options(name="status", get_if_exists=True, lifetime="detached").remote()
    ray.get(actor.set.remote("tokenize", "SUCCESS"))

After (Fray): the class is undecorated; ``create_actor`` gives a handle whose ``method.remote(...)``
returns a future; calls run one at a time, as in Ray. ``preemptible=False`` keeps a long-lived actor
(status tracking, a coordinator) off preemptible capacity.
"""

from __future__ import annotations

from fray_core import fray_job_ctx


class StatusActor:
    def __init__(self) -> None:
        self.status: dict[str, str] = {}

    def set(self, step: str, status: str) -> None:
        self.status[step] = status

    def get(self, step: str) -> str | None:
        return self.status.get(step)


def main() -> None:
    ctx = fray_job_ctx()
    actor = ctx.create_actor(StatusActor, name="status", get_if_exists=True, preemptible=False)
    ctx.get([actor.set.remote("tokenize", "SUCCESS"), actor.set.remote("train", "RUNNING")])
    same = ctx.create_actor(StatusActor, name="status", get_if_exists=True)  # the existing actor
    print(f"tokenize={ctx.get(same.get.remote('tokenize'))} train={ctx.get(same.get.remote('train'))}")


if __name__ == "__main__":
    main()
