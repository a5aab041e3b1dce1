"""``flashckpt simulate --precision``: mixed precision's state (float32 master weights and AdamW state) beside pure
bf16, the precision named in the output, and a precision with no mixed form refused (exit 2)."""

from pytest_flashckpt.cli import main


def _peak_line(out: str) -> int:
    line = next(line for line in out.splitlines() if line.startswith("predicted peak"))
    return int(line.split("(")[1].split(" bytes")[0])


def test_mixed_is_named_and_holds_more_than_pure_bf16(capsys):
    args = ["simulate", "--model", "tiny", "--seq", "64", "--batch", "1"]
    assert main([*args, "--precision", "mixed"]) == 0
    mixed = capsys.readouterr().out
    assert main(args) == 0
    pure = capsys.readouterr().out
    assert "tiny, mixed bf16/fp32, batch 1" in mixed and "tiny, bf16, batch 1" in pure
    assert _peak_line(mixed) > _peak_line(pure)


def test_mixed_needs_bf16(capsys):
    assert main(["simulate", "--model", "tiny", "--seq", "64", "--dtype", "fp16", "--precision", "mixed"]) == 2
    assert "precision mixed computes in bfloat16 over float32 master weights" in capsys.readouterr().err
