import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_grpc_code_matches_the_proto() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "generate_proto.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
