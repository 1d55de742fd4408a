"""bench/decode_probe.py --paged runs on the CI device (a quick smoke run): the dense and the
paged grouped kernels over the same keys (blocks shuffled over the pool), each checked
against float64, the comparison table printed."""

import json

from tests.helpers import load_bench


def _bench():
    return load_bench("decode_probe")


def test_decode_probe_paged_quick(tmp_path, capsys, device):
    out = tmp_path / "d.json"
    rc = _bench().main(["--shapes", "1,4,1,40", "--dtypes", "f32", "--d", "64", "--warm",
                        "0.01", "--reps", "2", "--paged", "--paged-block", "4",
                        "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "| 1,4,1,40 | f32 | " in text and "blocks of 4 shuffled" in text
    rows = {r["kernel"]: r for r in json.loads(out.read_text())["results"]}
    assert set(rows) == {"grouped", "streaming", "paged", "paged_str"}
    assert all(r["nse"] < 1e-10 for r in rows.values())
    assert rows["paged"]["request"]["pool_slots"] == 40  # 10 blocks of 4, no spare
    assert rows["grouped"]["request"]["pool_slots"] == 0


def test_paged_map_shuffles_whole_blocks():
    mod = _bench()
    import numpy as np

    slots, read = mod.paged_map(np.random.default_rng(0), 3, 37, 16)
    assert slots == 3 * 3 * 16 and read.shape == (3, 37) and read.dtype == np.int32
    assert len(np.unique(read)) == read.size  # no slot named twice
    assert (read[:, 1:16] - read[:, :15] == 1).all()  # a block's keys are consecutive slots
    assert not (read[:, ::16] % 16).any()  # ... starting at a block boundary
    x = np.arange(3 * 2 * 37 * 4, dtype=np.float32).reshape(3, 2, 37, 4)
    pool = mod.to_pool(x, read, slots)
    np.testing.assert_array_equal(pool[read].transpose(0, 2, 1, 3), x)


def test_decode_probe_times_launches_back_to_back(tmp_path, capsys, device):
    """--calls N records N launches behind their barriers and reports the time per launch
    (how torch's CUDA graph and llama.cpp's perf mode are timed); outputs still checked."""
    out = tmp_path / "d.json"
    rc = _bench().main(["--shapes", "1,4,1,300", "--dtypes", "f16", "--d", "64", "--warm",
                        "0.01", "--reps", "2", "--calls", "3", "--no-streaming",
                        "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    (row,) = json.loads(out.read_text())["results"]
    assert row["nse"] < 1e-6 and row["us"] > 0
    assert abs(sum(row["per_dispatch_us"]) - row["us"]) <= 1e-6 * row["us"] + 1e-3


def test_decode_timeline_instruments_every_workgroup(tmp_path, capsys, device):
    """bench/decode_timeline.py on the CI device: the instrumented kernel (clock reads and
    one extra binding) still matches float64, and every workgroup writes its timeline, the
    fused split's early-returning workgroups and its combining one included."""
    out = tmp_path / "t.json"
    rc = load_bench("decode_timeline").main(
        ["--shape", "1,8,2,700", "--kv", "f32", "--d", "64", "--warm", "0.01",
         "--variant", '{"splits": 3}', "--variant", '{"splits": 3, "fused_combine": false}',
         "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    rows = json.loads(out.read_text())
    assert [len(r["timestamps_us"]) for r in rows] == [1, 2]  # fused, then partial + combine
    for r in rows:
        assert r["nse"] < 1e-10
        # every workgroup: KV heads x splits x row blocks (1 row a block on a GPU, 4 on a CPU)
        assert r["written"] == r["workgroups"] and r["workgroups"] % (2 * 3) == 0
        assert r["span_us"] > 0 and r["loop"]["max"] > 0
        # the last of --calls launches (default 10); --repeat (default 3) submits' loop times
        assert r["calls"] == 10 and r["launch_us"] > 0
        assert len(r["per_wg"]["loop_us"]) == r["written"]
        assert set(r["repeat"]) == {"r_by_workgroup", "r_by_sm", "same_sm"}
