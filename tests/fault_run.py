"""run.py with faults injected at chosen points of training, for the fault-injection tests.

    python -m tests.fault_run FAULT[,FAULT...] <run.py flags>

FAULT is `<what>:<step>`, acting once, in training step <step> (1-based, as the logs count):
  sigterm_rollout  SIGTERM to this process as the step's rollout first steps the environment
  sigterm_update   SIGTERM to this process as the step's update starts
  double_signal    SIGTERM, then SIGINT, as the step's rollout first steps the environment
  kill_worker      SIGKILL to environment worker 0 as the rollout first steps the environment
  stop_worker      SIGSTOP to environment worker 0 there (it hangs until the pool kills it)
"""

from __future__ import annotations

import os
import signal
import sys

from absl import app

import run
from environments import pool as pool_lib
from seal_jax import trainer, update

ROLLOUT = {"sigterm_rollout", "double_signal", "kill_worker", "stop_worker"}


def main() -> None:
    """Parses the faults, patches them in and runs run.py's main with the remaining flags."""
    faults = {}
    for item in sys.argv.pop(1).split(","):
        what, step = item.split(":")
        faults[what] = int(step)
    current = {"step": 0}  # the 1-based step in flight

    def due(kinds: set[str]) -> list[str]:
        hits = [k for k in kinds & faults.keys() if faults[k] == current["step"]]
        for k in hits:
            del faults[k]  # once
        return hits

    one_step = trainer.train_one_step

    def train_one_step(run_, state, pool, ref_params):
        current["step"] = state.step + 1
        return one_step(run_, state, pool, ref_params)

    pool_step = pool_lib.EnvPool.step

    def step(self, texts):
        for fault in due(ROLLOUT):
            worker = self._workers[0][0].pid
            if fault == "kill_worker":
                os.kill(worker, signal.SIGKILL)
            elif fault == "stop_worker":
                os.kill(worker, signal.SIGSTOP)
            else:
                os.kill(os.getpid(), signal.SIGTERM)
                if fault == "double_signal":
                    os.kill(os.getpid(), signal.SIGINT)
        return pool_step(self, texts)

    ppo_epochs = update._ppo_epochs

    def _ppo_epochs(updater, params, opt_state, batch):
        if due({"sigterm_update"}):
            os.kill(os.getpid(), signal.SIGTERM)
        return ppo_epochs(updater, params, opt_state, batch)

    trainer.train_one_step = train_one_step
    pool_lib.EnvPool.step = step
    update._ppo_epochs = _ppo_epochs
    app.run(run.main, flags_parser=run.parse_flags)


if __name__ == "__main__":
    main()
