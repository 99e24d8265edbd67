"""Run folders: a resume never rewrites the config of the run it re-opens; what changed is listed;
a trial's wall time counts every attempt, also one ended by a real kill -9; outputs are not replaced."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from raycpt.config import load_config
from raycpt.errors import RaycptError
from raycpt.runs.folder import AttemptClock, open_run_dir, refuse_existing_outputs, resume_changes
from raycpt.runs.location import locate


def test_resume_keeps_the_saved_config_and_lists_changes(tmp_path):
    first = load_config(None, [f"tracking.run_root={tmp_path}", "train.max_steps=6"])
    run_dir = open_run_dir(first, "train", locate(first.tracking))
    saved = (run_dir / "config.yaml").read_text()
    again = load_config(None, [f"tracking.run_root={tmp_path}", "train.max_steps=8", "train.max_failures=5"])
    assert open_run_dir(again, "train", locate(again.tracking), resume=True) == run_dir
    assert (run_dir / "config.yaml").read_text() == saved  # not rewritten
    assert resume_changes(run_dir, again) == ["train.max_steps: 6 -> 8"]  # max_failures changes nothing saved
    assert resume_changes(run_dir, first) == []


def test_attempt_clock_sums_attempts_including_a_killed_one(tmp_path):
    path = tmp_path / "attempts.json"
    code = ("import sys, time; sys.path.insert(0, %r); from raycpt.runs.folder import AttemptClock\n"
            "with AttemptClock(%r, beat_s=0.2):\n    print('started', flush=True); time.sleep(600)\n"
            % (os.environ.get("PYTHONPATH", ""), str(path)))
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "started"
    time.sleep(2.0)
    os.kill(p.pid, signal.SIGKILL)  # nothing at the end of the attempt runs
    p.wait(timeout=10)
    killed = json.loads(path.read_text())["attempts"]
    assert len(killed) == 1 and 1.6 <= killed[0]["last"] - killed[0]["start"] <= 3.0
    with AttemptClock(path, beat_s=0.2) as clock:
        time.sleep(0.5)
        total = clock.elapsed
    first = killed[0]["last"] - killed[0]["start"]
    assert first + 0.5 <= total <= first + 1.5
    assert len(json.loads(path.read_text())["attempts"]) == 2


def test_refuse_existing_outputs(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("user data")
    refuse_existing_outputs([tmp_path / "empty", tmp_path / "new"], overwrite=False)
    with pytest.raises(RaycptError, match="already exists and is not empty"):
        refuse_existing_outputs([tmp_path / "full"], overwrite=False)
    refuse_existing_outputs([tmp_path / "full"], overwrite=True)
    assert (tmp_path / "full" / "mine.txt").read_text() == "user data"
