"""Cluster checks: shared storage checked on every node, and the launcher files and manifests checked for
placeholders. The MLflow store and the run root are checked where a command resolves where its runs live
(:func:`raycpt.runs.location.locate`, :func:`raycpt.runs.store.check_store`), not here.

* :func:`check_shared_storage` - on a multi-node Ray cluster the driver writes a token file under the
  run root and a tiny task pinned to every alive node reads it back; a node that cannot see it stops
  the run with one line naming the node.
* :func:`preflight` - the one call a multi-trial job makes once Ray is up: the storage check of the command's run
  root, and a warning (once) when several concurrent trials on several nodes would share one SQLite file.
* :func:`check_cluster_file` - ``raycpt cluster check``: placeholders and region mismatches in the parsed YAML of
  a launcher file or manifest, read through the config reader; :func:`cluster_check_lines` also looks the IAM
  instance profiles it names up in AWS when credentials are at hand (:mod:`raycpt.iam`).
"""

from __future__ import annotations

import re
import sys
import uuid
from pathlib import Path
from typing import Callable, Mapping, Optional

import yaml

from raycpt.config import read_yaml_documents
from raycpt.errors import RaycptError
from raycpt.iam import ProfileLookup, aws_profile_lookup, named_profiles, profile_lines
from raycpt.runs.store import check_run_root, uri_scheme

TOKEN_PREFIX = ".raycpt-storage-check-"

_warned: set[str] = set()


# ------------------------------------------------------------------------------------- shared storage
def read_token(path: str) -> str:
    """What a node sees at ``path``: the token, or ``"<missing: reason>"``."""
    try:
        return Path(path).read_text().strip()
    except OSError as e:
        return f"<missing: {e.strerror or e}>"


def storage_verdict(root: Path, token: str, seen: Mapping[str, str]) -> None:
    """Raise one line naming the first node whose view of the token file differs from ``token``."""
    for node, got in seen.items():
        if got != token:
            what = got if got.startswith("<missing") else "a different file (another storage mounted there)"
            raise RaycptError(
                f"shared storage: node {node} cannot see tracking.run_root {root} (token file: {what}); mount "
                "the same shared storage at the same path on every node (cluster/README.md)")


def alive_nodes() -> list[dict]:
    """The alive nodes of the Ray this process is connected to (none when Ray is not up: nothing to check)."""
    import ray

    if not ray.is_initialized():
        return []
    return [n for n in ray.nodes() if n.get("Alive")]


def node_label(node: dict) -> str:
    return f"{node.get('NodeManagerAddress', '?')} ({node['NodeID'][:12]})"


def check_shared_storage(root: Path, nodes: Optional[list[dict]] = None, timeout: float = 120.0) -> list[str]:
    """Token-file check over every alive node (see the module docstring); returns the node ids checked
    (empty on a single node, where there is nothing to check)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = alive_nodes() if nodes is None else nodes
    if len(nodes) < 2:
        return []
    root = Path(root)
    token = uuid.uuid4().hex
    path = root / f"{TOKEN_PREFIX}{token[:12]}"
    check_run_root(root)
    root.mkdir(parents=True, exist_ok=True)  # a multi-node job is about to write its run folder here anyway
    path.write_text(token)
    try:
        reader = ray.remote(num_cpus=0, max_retries=0)(read_token)
        refs = {node_label(n): reader.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            n["NodeID"], soft=False)).remote(str(path)) for n in nodes}
        seen = {}
        for label, ref in refs.items():
            try:
                seen[label] = ray.get(ref, timeout=timeout)
            except Exception as e:  # noqa: BLE001 - a node that cannot run the task cannot be checked
                seen[label] = f"<missing: the check task failed there: {type(e).__name__}>"
        storage_verdict(root, token, seen)
    finally:
        path.unlink(missing_ok=True)
    return [n["NodeID"] for n in nodes]


def preflight(where, max_concurrent_trials: int = 1, warn: Callable[[str], None] | None = None) -> list[str]:
    """The one call at the start of a multi-trial job, with Ray up: shared-storage check on a multi-node
    cluster, and the SQLite-with-concurrent-trials warning (once per process). ``where``: the command's
    :class:`raycpt.runs.location.RunLocation`. Returns the checked nodes."""
    nodes = alive_nodes()
    checked = check_shared_storage(where.root, nodes)
    uri = where.uri
    if len(nodes) > 1 and max_concurrent_trials > 1 and uri_scheme(uri) == "sqlite" and uri not in _warned:
        _warned.add(uri)
        (warn or _stderr)(
            f"raycpt: warning: {max_concurrent_trials} concurrent trials on {len(nodes)} nodes write one SQLite "
            f"store on shared storage ({uri}); SQLite over NFS with concurrent writers can lock or corrupt: "
            "set tracking.uri to an MLflow server (cluster/README.md)")
    return checked


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------- `raycpt cluster check`
#: AMI ids that AWS's own documentation prints as examples: none is an image anyone should boot
EXAMPLE_AMIS = {
    "ami-09ee1a996ac214ce7": "the example output of AWS's DLAMI guide (\"Finding the ID of a DLAMI\", us-east-1)",
    "ami-0abcdef1234567890": "the placeholder of AWS's EC2 and CLI documentation",
    "ami-1234567890abcdef0": "the placeholder of AWS's EC2 and CLI documentation",
    "ami-0123456789abcdef0": "the placeholder of AWS's EC2 documentation",
    "ami-12345678": "the placeholder of AWS's EC2 documentation",
}
#: the keys whose value is a container image: the Ray launcher's ``docker.image`` / ``head_image`` /
#: ``worker_image`` (also per node type, ray/autoscaler/ray-schema.json) and Kubernetes' ``containers[].image``
#: (RayJob / RayCluster head, worker, init and submitter containers)
IMAGE_KEYS = ("image", "head_image", "worker_image")
#: the keys whose value is an availability zone (the launcher's ``provider.availability_zone``, a comma list,
#: and EC2's ``Placement.AvailabilityZone`` in a node_config)
ZONE_KEYS = ("availability_zone", "AvailabilityZone")
_AMI = re.compile(r"\bami-[0-9a-f]{8,17}\b")
_FAKE_HEX = re.compile(r"0123456789|123456789012|abcdef|1a2b3c4d|deadbeef")
_EFS = re.compile(r"\bfs-[A-Za-z0-9]+\b")
_CR = re.compile(r"\bcr-[A-Za-z0-9]+\b")
_ECR = re.compile(r"\b(\d{12})\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com\b")
_EFS_HOST = re.compile(r"\bfs-[0-9a-f]+\.efs\.([a-z0-9-]+)\.amazonaws\.com\b")
_REGION_ARG = re.compile(r"(?:--region[ =]|\bREGION=|\bAWS_REGION=|\bAWS_DEFAULT_REGION=)\"?"
                         r"([a-z]{2}(?:-gov)?-[a-z]+-\d)\b")
_REGION = re.compile(r"\b([a-z]{2}(?:-gov)?-[a-z]+-\d)\b")
_REGISTRY_ARG = re.compile(r"\bREGISTRY=\"?([^\s;\"]+)")
_EXAMPLE_HOST = re.compile(r"(^|[./@])(example\.(com|org|net)|[a-z0-9-]+\.example|your[-_]?registry|my[-_]?registry)"
                           r"([:/]|$)", re.I)
_PLACEHOLDER_WORD = re.compile(r"[<>]|\b(changeme|placeholder|your[-_]?(image|registry|repo))\b", re.I)
#: AWS account ids that AWS's documentation uses as examples
EXAMPLE_ACCOUNTS = ("123456789012", "111122223333", "012345678901", "000000000000")


def _ami_problems(code: str, comment: str, region: Optional[str], key: str) -> list[str]:
    out = []
    for ami in _AMI.findall(code):
        if ami in EXAMPLE_AMIS:
            out.append(f"ImageId {ami} is {EXAMPLE_AMIS[ami]}, not an AMI of your account and region: write the "
                       "current one (cluster/set-ami.sh REGION)")
        elif _FAKE_HEX.search(ami[4:]):
            out.append(f"ImageId {ami} looks like a documentation placeholder: write a real AMI (cluster/set-ami.sh)")
        elif region and key == "ImageId":
            named = _REGION.findall(comment)
            if named and named[0] != region:
                out.append(f"ImageId {ami} is the AMI of {named[0]} (its comment), provider.region is {region}: AMI "
                           "ids are per region (cluster/set-ami.sh)")
    return out


def _id_problems(code: str) -> list[str]:
    out = []
    for fs in _EFS.findall(code):
        if fs.lower().startswith("fs-example") or _FAKE_HEX.search(fs[3:].lower()):
            out.append(f"file system {fs} is a placeholder: write your EFS/FSx id")
    for cr in _CR.findall(code):
        if cr.lower().startswith("cr-example") or _FAKE_HEX.search(cr[3:].lower()):
            out.append(f"capacity reservation {cr} is a placeholder: write the id of your Capacity Block or "
                       "reservation")
    return out


def _image_problems(ref: str, key: str) -> list[str]:
    """An image reference (``key``'s value, or a ``REGISTRY=`` in a command) that names an example registry or
    still holds a placeholder word."""
    host = ref.split("/")[0] if "/" in ref or key == "REGISTRY" else ""
    if host and _EXAMPLE_HOST.search(host):
        return [f"registry {host} is an example: write your registry (cluster/image.env, then cluster/set-image.sh)"]
    if _PLACEHOLDER_WORD.search(ref):
        return [f"{key} {ref} is a placeholder: write your image (cluster/image.env, then cluster/set-image.sh)"]
    return []


def _aws_problems(code: str, region: Optional[str]) -> list[str]:
    out = []
    for account, ecr_region in _ECR.findall(code):
        if account in EXAMPLE_ACCOUNTS:
            out.append(f"registry {account}.dkr.ecr.{ecr_region}.amazonaws.com names AWS's example account "
                       f"{account}: write your account's registry")
        elif region and ecr_region != region:
            out.append(f"registry {account}.dkr.ecr.{ecr_region}.amazonaws.com is in {ecr_region}, provider.region "
                       f"is {region}: push the image to the cluster's region (or move the cluster)")
    for account in EXAMPLE_ACCOUNTS:
        if re.search(rf"arn:aws[a-z-]*:[a-z0-9-]+:[a-z0-9-]*:{account}:", code):
            out.append(f"ARN with AWS's example account {account}: write your account id")
    if region:
        for efs_region in _EFS_HOST.findall(code):
            if efs_region != region:
                out.append(f"file system host in {efs_region}, provider.region is {region}: EFS mounts only "
                           "within its region")
        for arg in _REGION_ARG.findall(code):
            if arg != region:
                out.append(f"region {arg} in a command, provider.region is {region}")
    return out


def _line_problems(key: str, code: str, comment: str, region: Optional[str]) -> list[str]:
    """What is wrong with one source line (``code``) of a scalar value of ``key`` (``comment``: what follows the
    value on its line after ``#``)."""
    out = _ami_problems(code, comment, region, key) + _id_problems(code)
    for ref in _REGISTRY_ARG.findall(code):
        out += _image_problems(ref, "REGISTRY")
    return out + _aws_problems(code, region)


def _value_problems(key: str, value: str, region: Optional[str]) -> list[str]:
    """What is wrong with the whole value of ``key``: an image of an image key, the zones of a zone key."""
    out = _image_problems(value.strip(), key) if key in IMAGE_KEYS else []
    if region and key in ZONE_KEYS:
        out += [f"{key} {zone} is not in provider.region {region}" for zone in
                (z.strip() for z in value.split(",")) if zone and not zone.startswith(region)]
    return out


def _scalars(root: yaml.Node):
    """(key, scalar node) for every scalar value under ``root``; each node once per key that holds it, however many
    aliases name it (the loader already bounded the expanded size). Mapping keys themselves are not values."""
    seen: set[tuple[int, str]] = set()
    stack: list[tuple[str, yaml.Node]] = [("", root)]
    while stack:
        key, node = stack.pop()
        if (id(node), key) in seen:
            continue
        seen.add((id(node), key))
        if isinstance(node, yaml.ScalarNode):
            yield key, node
        elif isinstance(node, yaml.MappingNode):
            stack += [(str(k.value) if isinstance(k, yaml.ScalarNode) else "", v) for k, v in reversed(node.value)]
        else:
            stack += [(key, v) for v in reversed(node.value)]


def _scalar_lines(text: str, node: yaml.ScalarNode):
    """(line number, source text, comment after it) for each source line of a scalar: a folded command keeps each
    token on the line that holds it, and a match is reported at that line."""
    start, end = node.start_mark.index, node.end_mark.index
    eol = text.find("\n", end)
    comment = text[end:eol if eol >= 0 else len(text)].partition("#")[2]
    lines = text[start:end].split("\n")
    for i, line in enumerate(lines):
        yield node.start_mark.line + 1 + i, line, comment if i == len(lines) - 1 else ""


def _provider_region(docs: list) -> Optional[str]:
    provider = next((d.get("provider") for d in docs if isinstance(d, dict) and isinstance(d.get("provider"), dict)),
                    None)
    region = (provider or {}).get("region")
    return str(region) if region else None


def scan_cluster_file(path) -> tuple[list[str], Optional[str], list[tuple[int, str]]]:
    """(problems, provider.region, (line, name) of each IAM instance profile named) of one launcher YAML or manifest,
    read through the config reader (:func:`raycpt.config.read_yaml_documents`: a regular file of at most 1 MiB of
    UTF-8, aliases bounded)."""
    text, docs = read_yaml_documents(path, "cluster file", hint="a cluster file is")
    if not any(isinstance(data, dict) for _, data in docs):
        raise RaycptError(f"cluster file {path}: no YAML mapping in it; give a cluster-launcher YAML or a Kubernetes "
                          "manifest")
    region = _provider_region([data for _, data in docs])
    found: dict[tuple[int, str], None] = {}
    for root, _ in docs:
        for key, node in _scalars(root):
            if not isinstance(node.value, str) or node.tag != "tag:yaml.org,2002:str":
                continue
            lines = list(_scalar_lines(text, node))
            for n, code, comment in lines:
                for what in _line_problems(key, code, comment, region):
                    found.setdefault((n, what))
            first = next((n for n, code, _ in lines if node.value.strip()[:20] in code), lines[0][0])
            for what in _value_problems(key, node.value, region):
                found.setdefault((first, what))
    profiles: dict[str, int] = {}
    for root, _ in docs:
        for line, name in named_profiles(root):
            profiles.setdefault(name, line)
    return ([f"{path}:{n}: {what}" for n, what in sorted(found, key=lambda k: k[0])], region,
            sorted((line, name) for name, line in profiles.items()))


def check_cluster_file(path) -> list[str]:
    """Every placeholder or region mismatch left in a cluster-launcher YAML or Kubernetes manifest, one
    ``FILE:LINE: what`` line each (empty: nothing found), read from the parsed YAML's values (comments are
    documentation): AWS's documentation AMIs, ``fs-EXAMPLE`` and other placeholder file systems and capacity
    reservations, an example registry or placeholder in any image-valued key (:data:`IMAGE_KEYS`, block or flow
    style) or ``REGISTRY=``, example accounts, and an AMI (its comment), ECR registry, EFS host, ``--region`` or
    availability zone that is not the launcher's ``provider.region``. Raises one line (:class:`RaycptError`) for a
    file that is missing, not a regular file, too large, not UTF-8 or not YAML."""
    return scan_cluster_file(path)[0]


def cluster_check_lines(paths: list[str], lookup: Callable[[], ProfileLookup] = aws_profile_lookup
                        ) -> tuple[int, list[str], list[str]]:
    """``raycpt cluster check FILE...``: (exit code, lines for stdout, lines for stderr). Exit 2 with one line per
    problem; exit 0 with one line per clean file. The IAM instance profiles each file names are looked up through
    ``lookup()`` (made once, only when a file names one; :func:`raycpt.iam.aws_profile_lookup`): one line per
    profile that does not exist (a problem), else one line that they exist or were not checked, and why."""
    problems, ok = [], []
    made: list[ProfileLookup] = []
    for p in paths:
        found, region, profiles = scan_cluster_file(p)
        problems += found
        if not found:
            where = f"every region is provider.region {region}" if region else "no provider.region (a manifest)"
            ok.append(f"{p}: no placeholder left; {where}")
        if profiles and not made:
            made.append(lookup())
        said, missing = profile_lines(p, profiles, made[0]) if profiles else ([], [])
        ok += said
        problems += missing
    return (2 if problems else 0), ok, problems
