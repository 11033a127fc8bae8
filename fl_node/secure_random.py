"""Secret, cryptographically secure randomness for every draw differential privacy relies on.

DP protects a record only while the noise added for it is unknown to everyone else. A
``torch.Generator`` seeded with public values (the job's seed, the round, a participant's
index) lets any member regenerate the noise of a published update and subtract it, which
turns the release into the noise-free sum of clipped gradients. So the Gaussian noise of
DP-SGD and of the update mechanism, the Poisson batch masks and the committee's score noise
all come from :class:`SecureRandom`: a ChaCha20 keystream (RFC 8439, through the
``cryptography`` package) under a 256-bit key that is drawn from the operating system's
CSPRNG and never leaves the process. Nothing public determines it.

Gaussian samples resist floating-point attacks (Mironov 2012; Jin et al. 2022, "Are We There
Yet? Timing and Floating-Point Attacks on Differential Privacy Systems") the way Opacus's
secure mode does (Holohan and Braghin 2021, "Secure Random Sampling in Differential
Privacy"): each sample is the sum of four independent N(0, std^2) draws divided by two, each
draw made with the Box-Muller transform in the parameter's precision from uniforms with at
least as many random bits. The low-order bits of a released value then carry no usable trace of one draw.

A retry that must repeat a draw derives its key with :meth:`SecureRandom.derive`, an
HMAC-SHA256 of a node-local secret over the job, round and attempt: reproducible by the node,
by nobody else. Tests and benchmarks pass an explicit key to compare two engines on the same
draws.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import threading
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

KEY_BYTES = 32
_UNIT_53 = 2.0**-53
_UNIT_32 = 2.0**-32
_DOMAIN = b"defl/dp-randomness/v1"
T = TypeVar("T")


class SecureRandom:
    """A CSPRNG stream for DP draws; each instance has its own secret key.

    Thread-safe: draws are serialized, so one stream can serve a whole training run.
    """

    def __init__(self, key: bytes | None = None) -> None:
        if key is None:
            key = secrets.token_bytes(KEY_BYTES)
        if not isinstance(key, bytes | bytearray) or len(key) != KEY_BYTES:
            raise ValueError(f"a SecureRandom key is {KEY_BYTES} bytes")
        # ChaCha20's 16-byte nonce here is a 32-bit block counter and a 96-bit nonce; one key
        # is never reused with another nonce, so a zero nonce is fine and the stream is 256 GiB.
        self._stream = Cipher(algorithms.ChaCha20(bytes(key), b"\0" * 16), mode=None).encryptor()
        self._key = bytes(key)
        self._lock = threading.Lock()

    def fork(self, label: str) -> SecureRandom:
        """An independent stream for one purpose (batch masks, noise), derived from this key.

        Separate streams keep each purpose's sequence of draws fixed whatever the other does,
        so noise can be drawn ahead of its step without reordering anything.
        """
        return SecureRandom.derive(self._key, "fork", label)

    @classmethod
    def derive(cls, secret: bytes, *context: str | int) -> SecureRandom:
        """A stream keyed by HMAC-SHA256(secret, context): the same (secret, context) repeats it."""
        if len(secret) < 16:
            raise ValueError("a derivation secret needs at least 16 bytes")
        label = _DOMAIN + b"|" + b"|".join(str(part).encode() for part in context)
        return cls(hmac.new(secret, label, hashlib.sha256).digest())

    def random_bytes(self, count: int) -> bytes:
        with self._lock:
            return self._stream.update(bytes(count))

    def uniform(self, count: int) -> torch.Tensor:
        """``count`` float64 values uniform on the open interval (0, 1), 53 random bits each."""
        words = np.frombuffer(self.random_bytes(8 * count), dtype=np.uint64)
        values = ((words >> np.uint64(11)).astype(np.float64) + 0.5) * _UNIT_53
        return torch.from_numpy(values)

    def uniform32(self, count: int) -> torch.Tensor:
        """``count`` float32 values uniform on (0, 1) from 32 random bits each (float32 draws)."""
        words = np.frombuffer(self.random_bytes(4 * count), dtype=np.uint32)
        values = (words.astype(np.float64) + 0.5) * _UNIT_32  # exact, then one rounding
        return torch.from_numpy(values.astype(np.float32))

    def poisson_mask(self, count: int, rate: float) -> torch.Tensor:
        """Which of ``count`` records join a Poisson-sampled batch (each with probability ``rate``)."""
        return self.uniform(count) < rate

    def normal(
        self, shape: tuple[int, ...] | torch.Size, *, std: float, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """N(0, std^2) samples of ``shape``, each the sum of four independent draws over two.

        The Box-Muller transform runs in the precision of the result: float32 for float32
        parameters from 32-bit uniforms (as Opacus's secure mode draws with ``torch.normal``),
        float64 from 53-bit uniforms when float64 is asked for.
        """
        count = math.prod(shape)
        if std == 0 or count == 0:
            return torch.zeros(shape, dtype=dtype)
        # Box-Muller: each pair of uniforms gives two independent normals (cos and sin), so four
        # normals per sample take four uniforms.
        if dtype == torch.float64:
            uniforms = self.uniform(4 * count).view(2, 2 * count)
        else:
            uniforms = self.uniform32(4 * count).view(2, 2 * count)
        radius = torch.log(uniforms[0]).mul_(-2.0).sqrt_()
        angle = uniforms[1].mul_(2.0 * math.pi)
        pairs = torch.cos(angle).mul_(radius).add_(torch.sin(angle).mul_(radius))  # two normals each
        total = pairs[:count].add_(pairs[count:])  # four normals each
        return total.mul_(std / 2.0).to(dtype).view(shape)


class DrawAhead(Generic[T]):
    """The next result of ``draw``, computed on a helper thread one call ahead.

    DP-SGD's Gaussian noise and Poisson masks do not depend on the data, so the secret
    streams can fill the next step's draws while this step's forward and backward run: the
    draws, their order and their distribution are unchanged, only when they are made moves.
    ``take()`` returns the pending result (the caller owns it and may write into it) and
    starts the next. Whoever creates one closes it.
    """

    def __init__(self, draw: Callable[[], T]) -> None:
        self._draw = draw
        self._next = helper_thread().submit(draw)

    def take(self) -> T:
        value = self._next.result()
        self._next = helper_thread().submit(self._draw)
        return value

    def close(self) -> None:
        self._next.cancel()


# Poisson masks drawn per helper-thread task, at most this many uniforms at once (8 MiB).
_MASK_BLOCK_VALUES = 1 << 20
_MASK_BLOCK_STEPS = 16


def poisson_batches(
    source: SecureRandom | TorchRandom, count: int, rate: float
) -> Generator[torch.Tensor, None, None]:
    """The indices of each step's Poisson-sampled batch of ``count`` records, without end.

    Each record joins each batch independently with probability ``rate``
    (``source.poisson_mask``). From a secret stream the masks of up to 16 steps are drawn
    in one go, a block ahead on the helper thread: the same values in the same order as
    one ``poisson_mask`` per step (one stream, read in sequence), off the training thread.
    From a torch generator each step draws its own mask, in Opacus's order.
    """
    if not isinstance(source, SecureRandom):
        while True:
            yield torch.nonzero(source.poisson_mask(count, rate)).flatten()
    steps = max(1, min(_MASK_BLOCK_STEPS, _MASK_BLOCK_VALUES // max(count, 1)))

    def block() -> list[torch.Tensor]:
        masks = source.poisson_mask(steps * count, rate).view(steps, count)
        return [torch.nonzero(mask).flatten() for mask in masks]

    ahead = DrawAhead(block)
    try:
        while True:
            yield from ahead.take()
    finally:
        ahead.close()


_noise_executor: ThreadPoolExecutor | None = None


def helper_thread() -> ThreadPoolExecutor:
    """The one thread that makes DP draws ahead of the training thread (created on first use)."""
    global _noise_executor
    if _noise_executor is None:
        _noise_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dp-noise")
    return _noise_executor


class TorchRandom:
    """The same interface over a ``torch.Generator``: reproducible, and NOT private.

    For tests that compare an engine with Opacus's own generator-based noise, and for
    benchmarks that measure what the secure stream costs. Anyone who knows the seed can
    regenerate every draw, so no node trains with it.
    """

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def fork(self, label: str) -> TorchRandom:
        """One generator serves every purpose: its draws stay in Opacus's order."""
        return self

    def uniform(self, count: int) -> torch.Tensor:
        return torch.rand(count, generator=self.generator)

    def poisson_mask(self, count: int, rate: float) -> torch.Tensor:
        return self.uniform(count) < rate

    def normal(
        self, shape: tuple[int, ...] | torch.Size, *, std: float, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        return torch.normal(0.0, std, size=tuple(shape), generator=self.generator, dtype=dtype)


NoiseSource = SecureRandom | TorchRandom
