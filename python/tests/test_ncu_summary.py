"""bench/ncu_summary.py on a small hand-written report in the layout of
`ncu --csv --page raw` (ncu's log lines, a header row, a units row, one row
per kernel): every kernel is listed with its duration, SM throughput, a
tensor-pipe metric and its stall reasons largest first; a file without a
table is an error, not an empty success."""

import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "bench" / "ncu_summary.py"

SAMPLE = '''==PROF== Connected to process 4242 (python3)
profiled 1: s2k-d128 / flashcore-sm90
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed","sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio","smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"
"","","","","","","","","","","","usecond","%","%","inst","inst"
"0","4242","python3","h","void fc90::fc_sm90_fwd_kernel<2, true>(fc_sm90_params)","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","440.12","71.3","83.2","0.51","1.20"
"1","4242","python3","h","peer_fprop_kernel(params)","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","420.50","75.0","86.0","0.40","0.90"
==PROF== Disconnected from process 4242
'''


@pytest.mark.skipif(not TOOL.is_file(), reason="not in a source checkout")
def test_summary_lists_each_kernel(tmp_path):
    f = tmp_path / "ncu.csv"
    f.write_text(SAMPLE)
    res = subprocess.run([sys.executable, str(TOOL), str(f)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "fc90::fc_sm90_fwd_kernel<2, true>" in out and "(fc_sm90_params)" not in out
    assert "peer_fprop_kernel" in out
    assert "440.12 usecond" in out and "420.50 usecond" in out
    assert "71.3 %" in out and "83.2 %" in out
    first = out.split("== kernel 1")[0]
    assert "stalls (cycles per issued instruction): wait 1.20, barrier 0.51" in first


@pytest.mark.skipif(not TOOL.is_file(), reason="not in a source checkout")
def test_no_table_is_an_error(tmp_path):
    f = tmp_path / "ncu.csv"
    f.write_text("==PROF== Connected to process 1\n==ERROR== profiling failed\n")
    res = subprocess.run([sys.executable, str(TOOL), str(f)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "no raw CSV table" in res.stdout
