"""scripts/studies.sh from a checkout whose path has a space and a quote: the background chain it would start
parses, quotes every path, and the read-only subcommands run this checkout's plelab."""
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(),
                                reason="needs git and a git checkout (the script makes git worktrees)")


@pytest.fixture
def odd_checkout(tmp_path: Path) -> Path:
    """A clone of this repository at a path with a space and a quote, with the working tree's studies.sh."""
    parent = tmp_path / "a dir's name"
    parent.mkdir()
    clone = parent / "main"
    subprocess.run(["git", "clone", "-q", "--no-local", str(REPO), str(clone)], check=True)
    shutil.copy(REPO / "scripts" / "studies.sh", clone / "scripts" / "studies.sh")
    return clone


def test_dry_run_chain_parses_and_quotes_paths(odd_checkout: Path):
    out = subprocess.run(["bash", "scripts/studies.sh", "start", "--dry-run"], cwd=odd_checkout, check=True,
                         capture_output=True, text=True).stdout
    chain = out.strip().splitlines()[-1]
    subprocess.run(["bash", "-n", "-c", chain], check=True)
    # Every path of the checkout reaches bash as one word: the restore's PYTHONPATH and the saver's script.
    words = shlex.split(chain.replace(";", " ; "))
    assert f"PYTHONPATH={odd_checkout}" in words
    assert str(odd_checkout / "scripts" / "studies.sh") in words
    assert not any("a dir" in w and str(odd_checkout.parent) not in w for w in words), words


def test_status_reads_a_snapshot_with_this_checkouts_plelab(odd_checkout: Path):
    snapshots = sorted((odd_checkout / "studies").glob("*/*.sql"))
    if not snapshots:
        pytest.skip("no study snapshot committed in studies/")
    # A listed study that is not running here and has no snapshot says where its snapshot would be; give it one
    # (any committed snapshot: status reads only its header) and it is read from there.
    first = subprocess.run(["bash", "scripts/studies.sh", "status"], cwd=odd_checkout, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    missing = re.search(r"no snapshot at (.+?\.sql);", first.stdout)
    if missing:
        target = Path(missing.group(1))
        assert target.parent.parent == odd_checkout / "studies"  # studies/<name>/<sweep>.sql, in the study's folder
        target.parent.mkdir(exist_ok=True)
        shutil.copy(snapshots[0], target)
    out = subprocess.run(["bash", "scripts/studies.sh", "status"], cwd=odd_checkout, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    assert "its snapshot" in out.stdout and "'done':" in out.stdout, out.stdout
