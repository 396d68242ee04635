"""Generate the Python gRPC code from proto/ into coordinator_service/contract/rpc/.

The generated modules are committed so that installing the package needs no
protoc. `--check` regenerates into a temporary directory and fails when the
committed files differ from what proto/ produces.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO = ROOT / "proto" / "sink_coordinator.proto"
PACKAGE_DIR = "coordinator_service/contract/rpc"
OUTPUTS = (
    "sink_coordinator_pb2.py",
    "sink_coordinator_pb2.pyi",
    "sink_coordinator_pb2_grpc.py",
    "sink_coordinator_pb2_grpc.pyi",
)


def generate(out_dir: Path) -> None:
    # Mapping proto/ onto the package path makes the generated imports
    # absolute (`from coordinator_service.contract.rpc import ...`).
    bin_dir = Path(sys.executable).parent
    args = [
        "protoc",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        f"-I{PACKAGE_DIR}={ROOT / 'proto'}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        f"{PACKAGE_DIR}/{PROTO.name}",
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the committed code is stale")
    options = parser.parse_args()
    if not options.check:
        generate(ROOT)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        stale = [
            name
            for name in OUTPUTS
            if not filecmp.cmp(Path(tmp) / PACKAGE_DIR / name, ROOT / PACKAGE_DIR / name, shallow=False)
        ]
    if stale:
        sys.stderr.write(f"generated gRPC code is stale: {', '.join(stale)}; run `make proto`\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
