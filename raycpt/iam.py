"""``raycpt cluster check``: do the IAM instance profiles a launcher YAML names exist in the AWS account?

Each node type's ``node_config`` names its instance profile (``IamInstanceProfile: {Name: raycpt-head}`` or ``{Arn:
arn:aws:iam::ACCOUNT:instance-profile/PATH/NAME}``); a profile that does not exist fails only at ``ray up``, after the
head has been asked for. With AWS credentials at hand each name is looked up (boto3 when it is installed, with short
timeouts and no retries, else ``aws iam get-instance-profile`` when the AWS CLI is on PATH); without them, or without
either tool, one line says that the profiles were not checked and why. The lookup is a :class:`ProfileLookup`, so a
test injects its own (no network).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional

import yaml

TIMEOUT_S = 5.0
#: the environment variables that hand the AWS SDKs credentials, or say where to get them
CREDENTIAL_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE",
                        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI")


class Unchecked(Exception):
    """A lookup that got no answer (access denied, a timeout, no network): its message says what happened."""


@dataclass(frozen=True)
class ProfileLookup:
    """``exists(name)``: True / False, or :class:`Unchecked`; ``exists`` None: no lookup possible, ``why_not`` says
    why; ``via``: what looks the names up (``boto3``, ``aws CLI``)."""

    exists: Optional[Callable[[str], bool]]
    why_not: str = ""
    via: str = ""


# ------------------------------------------------------------------------------------- what the YAML names
def profile_name(value: object) -> Optional[str]:
    """The profile's name from an ``IamInstanceProfile`` value: its ``Name``, else the last part of its ``Arn``
    (``arn:aws:iam::123456789012:instance-profile/path/raycpt-head`` -> ``raycpt-head``)."""
    if not isinstance(value, Mapping):
        return None
    if isinstance(value.get("Name"), str) and value["Name"].strip():
        return value["Name"].strip()
    arn = value.get("Arn")
    if isinstance(arn, str) and ":instance-profile/" in arn:
        return arn.rsplit("/", 1)[-1].strip() or None
    return None


def named_profiles(root: yaml.Node) -> list[tuple[int, str]]:
    """(line, profile name) for every ``IamInstanceProfile`` mapping under ``root`` (a composed YAML document), each
    name once, at its first line."""
    found: dict[str, int] = {}
    stack, seen = [root], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.value == "IamInstanceProfile" and \
                        isinstance(v, yaml.MappingNode):
                    value = {str(a.value): b.value for a, b in v.value if isinstance(b, yaml.ScalarNode)}
                    name = profile_name(value)
                    if name is not None:
                        found.setdefault(name, v.start_mark.line + 1)
                stack.append(v)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
    return sorted(((line, name) for name, line in found.items()))


# ------------------------------------------------------------------------------------- looking them up
def credentials_in_environment(env: Mapping[str, str] = os.environ, home: Optional[Path] = None) -> Optional[str]:
    """Where AWS credentials are to be found without asking the network (a variable, or the shared credentials or
    config file), or None: an instance role is found only by boto3 (the instance metadata service)."""
    for name in CREDENTIAL_VARIABLES:
        if env.get(name):
            return name
    home = Path.home() if home is None else home
    for var, default in (("AWS_SHARED_CREDENTIALS_FILE", home / ".aws" / "credentials"),
                         ("AWS_CONFIG_FILE", home / ".aws" / "config")):
        path = Path(env.get(var) or default)
        if path.is_file():
            return str(path)
    return None


def boto3_lookup(timeout_s: float = TIMEOUT_S) -> ProfileLookup:
    """The lookup through boto3 (an ImportError when it is not installed)."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    session = boto3.Session()
    try:
        if session.get_credentials() is None:
            return ProfileLookup(None, "boto3 found no AWS credentials (environment, ~/.aws, instance role)")
    except BotoCoreError as e:
        return ProfileLookup(None, f"boto3 could not read the AWS credentials ({e})")
    client = session.client("iam", config=Config(connect_timeout=timeout_s, read_timeout=timeout_s,
                                                 retries={"max_attempts": 1}))

    def exists(name: str) -> bool:
        try:
            client.get_instance_profile(InstanceProfileName=name)
            return True
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") == "NoSuchEntity":
                return False
            raise Unchecked(f"{e.response.get('Error', {}).get('Code', 'error')}: {e}") from None
        except BotoCoreError as e:
            raise Unchecked(str(e)) from None

    return ProfileLookup(exists, via="boto3")


def cli_lookup(aws: str, timeout_s: float = TIMEOUT_S) -> ProfileLookup:
    """The lookup through the AWS CLI at ``aws``, when credentials are in the environment or ~/.aws."""
    where = credentials_in_environment()
    if where is None:
        return ProfileLookup(None, "no AWS credentials (no AWS_ACCESS_KEY_ID / AWS_PROFILE, no ~/.aws/credentials or "
                                   "~/.aws/config; an instance role is looked for only with boto3)")
    env = {**os.environ, "AWS_MAX_ATTEMPTS": "1", "AWS_PAGER": ""}

    def exists(name: str) -> bool:
        argv = [aws, "iam", "get-instance-profile", "--instance-profile-name", name, "--output", "json",
                "--cli-connect-timeout", str(int(timeout_s)), "--cli-read-timeout", str(int(timeout_s))]
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=4 * timeout_s, env=env)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise Unchecked(f"aws iam get-instance-profile did not answer ({type(e).__name__})") from None
        if p.returncode == 0:
            return True
        if "NoSuchEntity" in p.stderr:
            return False
        first = next((ln.strip() for ln in p.stderr.splitlines() if ln.strip()), f"exit {p.returncode}")
        raise Unchecked(f"aws iam get-instance-profile: {first[:300]}")

    return ProfileLookup(exists, via="aws CLI")


def aws_profile_lookup(timeout_s: float = TIMEOUT_S) -> ProfileLookup:
    """boto3 when it is installed, else the AWS CLI when it is on PATH, else none (and why)."""
    try:
        return boto3_lookup(timeout_s)
    except ImportError:
        pass
    aws = shutil.which("aws")
    if aws is None:
        return ProfileLookup(None, "neither boto3 nor the AWS CLI (aws) is installed")
    return cli_lookup(aws, timeout_s)


def profile_lines(path, named: list[tuple[int, str]], lookup: ProfileLookup) -> tuple[list[str], list[str]]:
    """(lines for stdout, problem lines for stderr) of one file's named profiles: one ``FILE:LINE:`` line per profile
    that does not exist; one line saying they exist, or that (some of) them were not checked and why."""
    if not named:
        return [], []
    names = ", ".join(name for _, name in named)
    if lookup.exists is None:
        return [f"{path}: IAM instance profiles {names} not checked: {lookup.why_not}"], []
    present, missing, unchecked = [], [], []
    for i, (line, name) in enumerate(named):
        try:
            (present if lookup.exists(name) else missing).append((line, name))
        except Unchecked as e:  # one line for this name and the rest: the next lookups would fail the same way
            unchecked = [f"{path}: IAM instance profiles {', '.join(n for _, n in named[i:])} not checked: {e}"]
            break
    ok = [f"{path}: IAM instance profiles {', '.join(n for _, n in present)} exist ({lookup.via})"] if present else []
    return ok + unchecked, [missing_line(path, line, name) for line, name in missing]


def missing_line(path, line: int, name: str) -> str:
    return (f"{path}:{line}: IAM instance profile {name} does not exist in this AWS account: create it and its role "
            "(docs/cluster.md, step 4), or name one that exists")
