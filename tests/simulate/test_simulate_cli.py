"""``flashckpt simulate``: prediction, fits / does not fit, and bad input naming the value (exit 2)."""

from pathlib import Path

import pytest

from pytest_flashckpt.cli import main


def test_prints_peak_breakdown_and_fit(capsys):
    assert main(["simulate", "--model", "tiny", "--seq", "128", "--batch", "2", "--strategy", "full", "--device-memory", "1GiB"]) == 0
    out = capsys.readouterr().out
    for word in ("predicted peak", "parameters", "gradients", "optimizer_state", "activations", "temporaries", "fits (headroom"):
        assert word in out


def test_does_not_fit_exits_1(capsys):
    assert main(["simulate", "--model", "tiny", "--seq", "128", "--batch", "2", "--device-memory", "1MiB"]) == 1
    assert "does not fit (short by" in capsys.readouterr().out


@pytest.mark.slow
def test_per_rank_with_world_size(capsys):
    assert main(["simulate", "--model", "tiny", "--seq", "128", "--batch", "4", "--world-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "per rank of 2 (FSDP, batch 2 per rank)" in out and "on 141 GB: fits" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--device-memory", "80XB"], "unknown size unit 'xb'"),
        (["--device-memory", "lots"], "'lots' is not a size"),
        (["--device-memory", "0"], "device memory '0' must be more than zero"),
        (["--seq", "4096"], "sequence length 4096 is longer than the 2048 positions of model card 'tiny'"),
        (["--batch", "4", "--world-size", "3"], "world size 3 does not divide the batch size 4"),
        (["--model", "no-such-card"], "no-such-card"),
        (["--kernel", "flash", "--dtype", "fp32"], "the flash kernel needs bfloat16 or float16, not float32"),
        (["--dtype", "int8"], "unknown dtype 'int8'"),
    ],
)
def test_bad_input_names_the_value(argv, message, capsys):
    assert main(["simulate", "--model", "tiny", "--seq", "128", "--batch", "2", *argv]) == 2
    assert message in capsys.readouterr().err


def test_card_width_not_divisible_by_heads(tmp_path: Path, capsys):
    card = tmp_path / "bad.yaml"
    card.write_text("name: bad\nn_embd: 5140\nn_head: 40\n", encoding="utf-8")
    assert main(["simulate", "--model", str(card), "--seq", "128"]) == 2
    assert "n_embd (5140) must be divisible by n_head (40)" in capsys.readouterr().err
