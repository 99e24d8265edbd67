#!/usr/bin/env bash
# Write the current "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04)" id of a region (default: the
# launcher's provider.region) into every ImageId of ray-cluster-h200.yaml. AMI ids are per region and change
# with each DLAMI release; AWS publishes the latest one as a public SSM parameter (needs ssm:GetParameter).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
yaml="$here/ray-cluster-h200.yaml"
region="${1:-$(sed -n -E 's/^\s*region:\s*(\S+).*/\1/p' "$yaml" | head -1)}"
param=/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id
ami="$(aws ssm get-parameter --region "$region" --name "$param" --query Parameter.Value --output text)"
[[ "$ami" =~ ^ami-[0-9a-f]{8,17}$ ]] || { echo "not an AMI id: $ami" >&2; exit 1; }
# the AMI's region goes into its comment: `raycpt cluster check` refuses an AMI whose region is not provider.region
sed -i -E "s#^(\s*ImageId: )ami-[0-9a-f]+.*#\1${ami}   \# ${region}: DLAMI Base OSS Nvidia Driver GPU (Ubuntu 22.04), latest on $(date -u +%F) (cluster/set-ami.sh)#" "$yaml"
sed -i -E "s#^(\s*region: )\S+#\1${region}#" "$yaml"
grep -n "ImageId:\|region:" "$yaml"
