"""Issue 48: ``raycpt cluster check`` looks up the IAM instance profiles a launcher YAML names (``IamInstanceProfile:
{Name: ...}`` or ``{Arn: ...}`` under a node type's node_config). Every lookup here is a fake (an injected
:class:`raycpt.iam.ProfileLookup`, or a fake ``aws`` executable): nothing reaches the network. Credentials absent:
one line saying the profiles were skipped and why; a profile missing: one line naming it at its line, exit 2; every
profile present: one line saying so."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from raycpt.cluster import cluster_check_lines
from raycpt.iam import ProfileLookup, Unchecked, cli_lookup, credentials_in_environment, profile_name

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = """provider: {type: aws, region: us-east-1}
available_node_types:
  head:
    node_config:
      InstanceType: m7i.8xlarge
      IamInstanceProfile: {Name: raycpt-head}
  gpu:
    node_config:
      InstanceType: p5en.48xlarge
      IamInstanceProfile:
        Arn: arn:aws:iam::210987654321:instance-profile/team/raycpt-worker
head_node_type: head
"""


def _line_of(text: str, needle: str) -> int:
    """The 1-based line holding ``needle``, read from the text (not from the checker)."""
    (n,) = [n for n, line in enumerate(text.splitlines(), 1) if needle in line]
    return n


def _launcher(tmp_path) -> Path:
    f = tmp_path / "launcher.yaml"
    f.write_text(LAUNCHER)
    return f


class Fake:
    """A lookup that answers from a set of existing names and counts what it was asked and how often it was made."""

    def __init__(self, existing=(), fail_on=None):
        self.existing, self.fail_on, self.asked, self.made = set(existing), fail_on, [], 0

    def __call__(self) -> ProfileLookup:
        self.made += 1

        def exists(name: str) -> bool:
            self.asked.append(name)
            if name == self.fail_on:
                raise Unchecked("AccessDenied: not authorized to perform iam:GetInstanceProfile")
            return name in self.existing

        return ProfileLookup(exists, via="fake")


def test_credentials_absent_is_one_skipped_line_exit_0(tmp_path):
    f = _launcher(tmp_path)
    code, ok, problems = cluster_check_lines([str(f)], lookup=lambda: ProfileLookup(None, "no AWS credentials here"))
    assert code == 0 and problems == []
    assert ok == [f"{f}: no placeholder left; every region is provider.region us-east-1",
                  f"{f}: IAM instance profiles raycpt-head, raycpt-worker not checked: no AWS credentials here"]


def test_a_missing_profile_is_one_line_naming_it_at_its_line(tmp_path):
    f = _launcher(tmp_path)
    fake = Fake(existing={"raycpt-head"})
    code, ok, problems = cluster_check_lines([str(f)], lookup=fake)
    worker_line = _line_of(LAUNCHER, "Arn: arn:aws:iam")  # block style: the Arn's line, below its key
    assert code == 2 and len(problems) == 1
    assert problems[0].startswith(f"{f}:{worker_line}: IAM instance profile raycpt-worker does not exist"), problems
    assert "raycpt-head" not in problems[0]
    assert ok[-1] == f"{f}: IAM instance profiles raycpt-head exist (fake)"
    assert fake.asked == ["raycpt-head", "raycpt-worker"] and fake.made == 1


def test_every_profile_present_is_one_ok_line(tmp_path):
    f = _launcher(tmp_path)
    code, ok, problems = cluster_check_lines([str(f)], lookup=Fake(existing={"raycpt-head", "raycpt-worker"}))
    assert code == 0 and problems == []
    assert ok[-1] == f"{f}: IAM instance profiles raycpt-head, raycpt-worker exist (fake)"


def test_a_lookup_without_an_answer_is_one_line_and_stops_asking(tmp_path):
    f = _launcher(tmp_path)
    fake = Fake(existing={"raycpt-head", "raycpt-worker"}, fail_on="raycpt-head")
    code, ok, problems = cluster_check_lines([str(f)], lookup=fake)
    assert code == 0 and problems == [] and fake.asked == ["raycpt-head"]
    assert ok[-1] == (f"{f}: IAM instance profiles raycpt-head, raycpt-worker not checked: AccessDenied: not "
                      "authorized to perform iam:GetInstanceProfile")


def test_the_lookup_is_made_once_and_only_for_a_file_that_names_a_profile(tmp_path):
    f = _launcher(tmp_path)
    manifest = tmp_path / "job.yaml"
    manifest.write_text("kind: RayJob\nspec: {entrypoint: raycpt sweep}\n")
    fake = Fake(existing={"raycpt-head", "raycpt-worker"})
    assert cluster_check_lines([str(manifest)], lookup=fake) == (
        0, [f"{manifest}: no placeholder left; no provider.region (a manifest)"], [])
    assert fake.made == 0
    code, ok, _ = cluster_check_lines([str(f), str(manifest), str(f)], lookup=fake)
    assert code == 0 and fake.made == 1 and sum("exist (fake)" in line for line in ok) == 2


def test_the_shipped_launcher_names_the_head_and_worker_profiles(tmp_path):
    fake = Fake()
    path = "cluster/ray-cluster-h200.yaml"
    text = (ROOT / path).read_text()
    code, _, problems = cluster_check_lines([str(ROOT / path)], lookup=fake)
    assert code == 2 and fake.asked == ["raycpt-head", "raycpt-worker"]
    missing = [p for p in problems if "IAM instance profile" in p]
    assert missing == [f"{ROOT / path}:{_line_of(text, '{Name: raycpt-head}')}: IAM instance profile raycpt-head "
                       "does not exist in this AWS account: create it and its role (docs/cluster.md, step 4), or name "
                       "one that exists",
                       f"{ROOT / path}:{_line_of(text, '{Name: raycpt-worker}')}: IAM instance profile raycpt-worker "
                       "does not exist in this AWS account: create it and its role (docs/cluster.md, step 4), or name "
                       "one that exists"]


def test_profile_name_from_name_or_arn():
    assert profile_name({"Name": "raycpt-head"}) == "raycpt-head"
    assert profile_name({"Arn": "arn:aws:iam::210987654321:instance-profile/raycpt-worker"}) == "raycpt-worker"
    assert profile_name({"Arn": "arn:aws:iam::210987654321:instance-profile/a/b/raycpt-x"}) == "raycpt-x"
    assert profile_name({"Arn": "arn:aws:iam::210987654321:role/raycpt"}) is None  # a role is not a profile
    assert profile_name("raycpt-head") is None and profile_name({}) is None


def test_credentials_in_environment(tmp_path):
    none = {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no"), "AWS_CONFIG_FILE": str(tmp_path / "no")}
    assert credentials_in_environment(none, home=tmp_path) is None
    assert credentials_in_environment({}, home=tmp_path) is None  # no ~/.aws under this home
    assert credentials_in_environment({**none, "AWS_PROFILE": "dev"}, home=tmp_path) == "AWS_PROFILE"
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text("[default]\n")
    assert credentials_in_environment({}, home=tmp_path) == str(tmp_path / ".aws" / "credentials")


def _fake_aws(tmp_path) -> str:
    """An ``aws`` that answers ``iam get-instance-profile`` as the real one does: found, NoSuchEntity, or denied."""
    exe = tmp_path / "aws"
    exe.write_text("#!/bin/sh\n"
                   "echo \"$@\" >> \"$0.calls\"\n"
                   "case \"$4\" in\n"
                   "  raycpt-head) echo '{\"InstanceProfile\": {}}'; exit 0;;\n"
                   "  denied) echo 'An error occurred (AccessDenied) when calling the GetInstanceProfile operation: "
                   "no' >&2; exit 254;;\n"
                   "  *) echo \"An error occurred (NoSuchEntity) when calling the GetInstanceProfile operation: "
                   "Instance Profile $4 cannot be found.\" >&2; exit 254;;\n"
                   "esac\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return str(exe)


def test_the_aws_cli_lookup_reads_found_missing_and_denied(tmp_path, monkeypatch):
    aws = _fake_aws(tmp_path)
    for k in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no"))
    skipped = cli_lookup(aws)
    assert skipped.exists is None and skipped.why_not.startswith("no AWS credentials")
    assert not Path(aws + ".calls").exists()  # without credentials the CLI is not even started
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFAKEFAKEFAKEFAKE")
    lookup = cli_lookup(aws)
    assert lookup.via == "aws CLI" and lookup.exists("raycpt-head") is True and lookup.exists("raycpt-gone") is False
    with pytest.raises(Unchecked, match="AccessDenied"):  # a denied lookup is no answer: neither True nor False
        lookup.exists("denied")
    calls = Path(aws + ".calls").read_text().splitlines()
    assert calls[0].split()[:5] == ["iam", "get-instance-profile", "--instance-profile-name", "raycpt-head", "--output"]
