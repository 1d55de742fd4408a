"""bench/engine.py --quick runs on the CI device: the batched engine and one prompt at a
time generate the same tokens, the pool holds less than fixed-capacity rows, and a request
whose 32-token prefix is cached generates what a cold engine generates."""

import re

from tests.helpers import load_bench


def test_engine_bench_quick(capsys, device):
    rc = load_bench("engine").main(["--quick"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "outputs identical" in text and "equal a cold engine's" in text
    share = float(re.search(r"rows of \d+ \(([\d.]+)%\)", text).group(1))
    assert 0 < share < 100, text
    assert re.search(r"warm [\d.]+ ms \(32 cached\)", text), text
