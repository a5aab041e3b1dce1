"""A training loop of your own, checkpointed with pytest-flashckpt: save, crash, resume, bitwise.

The model (a small GRU language model), the data loader and the loop are plain PyTorch; the project ships none of
them. What the checkpoint holds: the model, the optimizer, the (optional) LR scheduler, the RNG streams and, through
``extra``, the loader's position: anything with ``state_dict()`` / ``load_state_dict()`` (DCP's ``Stateful``).

    python examples/own_loop.py RUN_DIR --steps 8 [--stop-after 5] [--strategy async]

prints ``step <n> loss <x>`` per step and, at the end, ``weights <sha256>`` of the final weights: a run stopped with
``--stop-after`` and started again resumes where it stopped and ends with the same hash as one run straight through.
"""

import argparse
import hashlib

import torch
import torch.nn as nn

from pytest_flashckpt.checkpoint import CheckpointManager


class TinyGRU(nn.Module):
    def __init__(self, vocab: int = 50, width: int = 32) -> None:
        super().__init__()
        self.embed, self.rnn, self.out = nn.Embedding(vocab, width), nn.GRU(width, width, batch_first=True), nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(self.rnn(self.embed(tokens))[0])


class Loader:
    """Endless shuffled batches; its position (epoch, index) is what a resume needs."""

    def __init__(self, data: torch.Tensor, batch: int) -> None:
        self.data, self.batch, self.epoch, self.index = data, batch, 0, 0

    def next(self) -> torch.Tensor:
        order = torch.randperm(len(self.data), generator=torch.Generator().manual_seed(self.epoch))
        rows = order[self.index : self.index + self.batch]
        self.index += self.batch
        if self.index >= len(self.data):
            self.epoch, self.index = self.epoch + 1, 0
        return self.data[rows]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.index = state["epoch"], state["index"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--stop-after", type=int, default=None)
    parser.add_argument("--strategy", default="sync")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = TinyGRU()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    loader = Loader(torch.randint(0, 50, (24, 17), generator=torch.Generator().manual_seed(1)), batch=4)

    with CheckpointManager(args.root, model=model, optimizer=optimizer, scheduler=scheduler,
                           extra={"loader": loader}, strategy=args.strategy, max_keep=2) as ckpt:
        start = ckpt.resume() or 0
        for step in range(start, args.steps):
            batch = loader.next()
            logits = nn.functional.dropout(model(batch[:, :-1]), 0.1)  # uses the RNG: restored too
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
            loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            print(f"step {step + 1} loss {loss.item():.6f}")
            ckpt.save(step + 1)
            if step + 1 == args.stop_after:
                return
    digest = hashlib.sha256(b"".join(t.detach().numpy().tobytes() for t in model.state_dict().values()))
    print(f"weights {digest.hexdigest()}")


if __name__ == "__main__":
    main()
