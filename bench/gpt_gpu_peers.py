#!/usr/bin/env python3
"""PyTorch on the GPU on samples/gpt's model and training: the same GPT, the same batches, the same
optimizer and schedule, in f32 (TF32 off), first in eager mode, then under torch.compile. Per mode
it prints the median step time over the steps after the first two (CUDA events), tokens/s and the
validation loss after --steps steps: the numbers of the sample's closing `summary:` line.

Usage (on the GPU machine; scripts/gpu_suite.sh's gpt step runs it beside `run.sh gpt --device gpu`):
  python3 bench/gpt_gpu_peers.py [--steps N] [--data PATH] [--layers L --width C --heads H
                                  --context T --batch-size B] [--no-compile] [--device cpu]
Defaults are the sample's (samples/gpt/main.cpp): 4 layers, width 128, 4 heads, context 128,
batch 32, 2000 steps, Debian's fortunes.

What is the same as the sample (nn/gpt.cpp, nn/text_corpus.cpp, nn/lr_schedule.cpp, nn/adamw.cpp):
- Model: GPT-2's layout. Token embedding [vocab, C] and learned positions [context, C], both
  N(0, 0.02); per block x + attn(ln1(x)), then x + proj(gelu_tanh(fc(ln2(x)))); LayerNorm eps
  1e-5 (weight 1, bias 0); causal attention with q, k, v, proj as separate C x C linears, heads
  split as [B, T, H, C/H] -> [B, H, T, C/H], scale 1/sqrt(C/H); MLP width 4C; final LayerNorm;
  an untied head C -> vocab with a bias; no dropout. Linear weights Xavier-uniform
  (+-sqrt(6 / (in + out))), biases 0.
- Initial values: the very numbers Tessera draws. Its initialisers are Philox-4x32-10 on the
  global element index keyed by the layer's seed (codegen/philox.cpp, codegen/lower_kernel.cpp's
  random()); this script computes the same stream (seeds: tokens seed, positions seed+1, head
  seed+2, block l's layers seed + 100 (l+1) + {0,1,2,3 (q,k,v,proj), 10 (fc), 11 (proj)}). They
  agree to an ulp or so (Tessera's f32 log/cos are its own polynomials), so both start from the
  same validation loss: compare this script's `step 0` line with the sample's.
- Data: the same bytes (a file, or a directory's regular files with no '.' in the name, in name
  order), the same vocabulary (the bytes that occur, in byte order), the same split (4096-byte
  blocks, block b held out when int((b+1) f) > int(b f)), and the same windows: each step's starts
  come from std::mt19937_64(seed * 1000003 + step) through libstdc++'s
  uniform_int_distribution (Lemire's method on 128-bit products, GCC 11 and later: the bundle's
  compiler), the validation batches from one mt19937_64(seed * 7919 + 1); both are reimplemented
  here bit for bit (checked against libstdc++ 12's on 800 draws, the 2^40 range included).
- Optimizer: AdamW betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on every parameter, gradient
  norm clipped to 1.0 (PyTorch's clip_grad_norm_, which Tessera's copies), linear warmup over
  min(100, steps) steps then cosine decay from 1e-3 to 1e-4 at --steps; the loss each step is
  read back to the host (as the sample does for its progress bar), so steps do not overlap.
- The validation loss: the mean loss over the same --eval-batches (8) batches of the validation
  split, after step 0, every --eval-interval (100) steps and after the last.

What is not the same:
- Kernels: cuBLAS in both, but PyTorch's reductions, its attention (scaled_dot_product_attention
  picks the memory-efficient kernel for f32; Tessera's CUDA backend computes attention from
  ordinary ops with the [T, T] scores stored) and its fused ops differ from Tessera's, so the loss
  curves drift apart by rounding, not bitwise alike. (On a CPU, with Debian's PyTorch 1.13 and
  --device cpu, this script's train and validation losses equalled the sample's --mesh dp=1 to the
  4 printed decimals at every interval: 12 steps at the default sizes, 30 at 2 layers/width 64.)
- AdamW: PyTorch's foreach implementation (eager in both modes; torch.compile compiles the
  model's forward and backward and the loss, not the optimizer or the clipping); Tessera compiles
  the whole step (forward, backward, clipping, AdamW) into one program.
- Timing: step times here are CUDA-event times from before zero_grad to after the optimizer step
  (wall times printed beside them); the sample times each step with the host clock around its
  compiled step and the loss read, its batch copied to the device inside the step. The batches
  here are cut on the device before the timed region.
- One device only (the sample's --mesh dp=1); the sample's generation at the end has no peer here.
"""
import argparse
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

MASK32 = (1 << 32) - 1
MASK64 = (1 << 64) - 1
BLOCK_BYTES = 4096  # TextCorpus::kBlockBytes


# ---- std::mt19937_64 and libstdc++'s uniform_int_distribution<int64_t>, bit for bit ----
class MT19937_64:
    N, M = 312, 156
    MATRIX_A = 0xB5026F5AA96619E9
    UPPER, LOWER = MASK64 & ~((1 << 31) - 1), (1 << 31) - 1

    def __init__(self, seed):
        mt = [0] * self.N
        mt[0] = seed & MASK64
        for i in range(1, self.N):
            prev = mt[i - 1]
            mt[i] = (6364136223846793005 * (prev ^ (prev >> 62)) + i) & MASK64
        self.mt, self.index = mt, self.N

    def _twist(self):
        mt, n, m = self.mt, self.N, self.M
        for i in range(n):
            y = (mt[i] & self.UPPER) | (mt[(i + 1) % n] & self.LOWER)
            mt[i] = mt[(i + m) % n] ^ (y >> 1) ^ (self.MATRIX_A if y & 1 else 0)
        self.index = 0

    def __call__(self):
        if self.index >= self.N:
            self._twist()
        z = self.mt[self.index]
        self.index += 1
        z ^= (z >> 29) & 0x5555555555555555
        z ^= (z << 17) & 0x71D67FFFEDA60000
        z ^= (z << 37) & 0xFFF7EEE000000000
        z ^= z >> 43
        return z & MASK64


def uniform_int(rng, low, high):
    """std::uniform_int_distribution<int64_t>(low, high)(rng) as libstdc++ (GCC >= 11) computes it
    for a 64-bit engine: Lemire's nearly divisionless method on 128-bit products."""
    urange = (high - low) & MASK64
    if urange == MASK64:
        return low + rng()
    erange = urange + 1
    product = rng() * erange
    lowbits = product & MASK64
    if lowbits < erange:
        threshold = ((-erange) & MASK64) % erange
        while lowbits < threshold:
            product = rng() * erange
            lowbits = product & MASK64
    return low + (product >> 64)


def random_window_starts(n_tokens, count, context, rng):
    last = n_tokens - context - 1
    if last < 0:
        raise SystemExit(f"random_window_starts: {n_tokens} tokens hold no window of {context + 1}")
    return [uniform_int(rng, 0, last) for _ in range(count)]


# ---- the corpus (nn/text_corpus.cpp) ----
def read_path(path):
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such file or directory '{path}'")
    if not os.path.isdir(path):
        with open(path, "rb") as f:
            return f.read()
    names = sorted(e.name for e in os.scandir(path)
                   if not e.is_symlink() and e.is_file(follow_symlinks=False) and "." not in e.name)
    parts = []
    for name in names:
        with open(os.path.join(path, name), "rb") as f:
            parts.append(f.read())
    return b"".join(parts)


class Corpus:
    def __init__(self, path, validation_fraction):
        text = read_path(path)
        if not text:
            raise SystemExit(f"'{path}' holds no text")
        self.size = len(text)
        alphabet = sorted(set(text))
        self.vocab = len(alphabet)
        table = bytearray(256)
        for i, byte in enumerate(alphabet):
            table[byte] = i
        ids = text.translate(bytes(table))
        train, validation = [], []
        blocks = (len(text) + BLOCK_BYTES - 1) // BLOCK_BYTES
        for b in range(blocks):
            held_out = int(float(b + 1) * validation_fraction) > int(float(b) * validation_fraction)
            (validation if held_out else train).append(ids[b * BLOCK_BYTES:(b + 1) * BLOCK_BYTES])
        self.train = torch.frombuffer(bytearray(b"".join(train)), dtype=torch.uint8).long()
        self.validation = torch.frombuffer(bytearray(b"".join(validation)), dtype=torch.uint8).long()


# ---- Tessera's initialisers: Philox-4x32-10 on the global element index ----
def _mul_hi_lo(constant, word):
    """The 64-bit product of a 32-bit constant and int64 words in [0, 2^32), as (hi, lo) words,
    in int64 arithmetic that never overflows."""
    lo16, hi16 = word & 0xFFFF, word >> 16
    p_lo, p_hi = lo16 * constant, hi16 * constant  # each < 2^48
    t = p_lo + ((p_hi & 0xFFFF) << 16)
    return (p_hi >> 16) + (t >> 32), t & MASK32


def philox(counter, key):
    c0, c1 = counter & MASK32, (counter >> 32) & MASK32
    c2, c3 = torch.zeros_like(counter), torch.zeros_like(counter)
    k0, k1 = key & MASK32, (key >> 32) & MASK32
    for _ in range(10):
        hi0, lo0 = _mul_hi_lo(0xD2511F53, c0)
        hi1, lo1 = _mul_hi_lo(0xCD9E8D57, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + 0x9E3779B9) & MASK32, (k1 + 0xBB67AE85) & MASK32
    return c0, c1, c2, c3


def tessera_random(shape, seed, normal, a, b):
    """random_uniform(shape, seed, .., a, b) or random_normal(shape, seed, .., mean a, stddev b) in f32."""
    counter = torch.arange(math.prod(shape), dtype=torch.int64)
    words = philox(counter, seed)
    f32 = torch.float32
    scale = 2.0 ** -24
    if not normal:
        u = (words[0] >> 8).to(f32) * scale
        return (torch.tensor(a, dtype=f32) + torch.tensor(b - a, dtype=f32) * u).reshape(shape)
    u1 = ((words[0] >> 8) + 1).to(f32) * scale
    u2 = (words[2] >> 8).to(f32) * scale
    z = torch.sqrt(torch.tensor(-2.0, dtype=f32) * torch.log(u1)) * torch.cos(torch.tensor(2 * math.pi, dtype=f32) * u2)
    return (torch.tensor(a, dtype=f32) + torch.tensor(b, dtype=f32) * z).reshape(shape)


# ---- the model (nn/gpt.cpp) ----
class CausalSelfAttention(torch.nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.proj = (torch.nn.Linear(width, width) for _ in range(4))

    def forward(self, x):
        b, t, c = x.shape
        d = c // self.heads

        def split(y):
            return y.view(b, t, self.heads, d).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        if hasattr(F, "scaled_dot_product_attention"):
            attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # PyTorch before 2.0 (a CPU check elsewhere): the same, written out
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            attended = torch.softmax(scores.masked_fill(mask, float("-inf")), -1) @ v
        return self.proj(attended.transpose(1, 2).reshape(b, t, c))


class Block(torch.nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(width, eps=1e-5), torch.nn.LayerNorm(width, eps=1e-5)
        self.attn = CausalSelfAttention(width, heads)
        self.fc, self.proj = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(torch.nn.Module):
    def __init__(self, vocab, context, layers, width, heads):
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, width)
        self.positions = torch.nn.Embedding(context, width)
        self.blocks = torch.nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(width, eps=1e-5)
        self.head = torch.nn.Linear(width, vocab)
        self.register_buffer("position_ids", torch.arange(context), persistent=False)

    def forward(self, ids):
        x = self.tokens(ids) + self.positions(self.position_ids[:ids.shape[1]])
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def tessera_initial_state(model, seed, width):
    """The sample's initial parameters, by the module names of nn/gpt.cpp's seeds."""
    state = {}

    def dense(name, in_dim, out_dim, dense_seed):
        limit = math.sqrt(6.0 / (in_dim + out_dim))
        # Tessera's Dense weight is [in, out] (y = x @ W + b); nn.Linear keeps W^T.
        state[name + ".weight"] = tessera_random([in_dim, out_dim], dense_seed, False, -limit, limit).t().contiguous()
        state[name + ".bias"] = torch.zeros(out_dim)

    vocab, context = model.tokens.num_embeddings, model.positions.num_embeddings
    state["tokens.weight"] = tessera_random([vocab, width], seed, True, 0.0, 0.02)
    state["positions.weight"] = tessera_random([context, width], seed + 1, True, 0.0, 0.02)
    for layer in range(len(model.blocks)):
        base, prefix = seed + 100 * (layer + 1), f"blocks.{layer}."
        for offset, name in enumerate(("q", "k", "v", "proj")):
            dense(prefix + "attn." + name, width, width, base + offset)
        dense(prefix + "fc", width, 4 * width, base + 10)
        dense(prefix + "proj", 4 * width, width, base + 11)
        for norm in ("ln1", "ln2"):
            state[prefix + norm + ".weight"], state[prefix + norm + ".bias"] = torch.ones(width), torch.zeros(width)
    state["ln_f.weight"], state["ln_f.bias"] = torch.ones(width), torch.zeros(width)
    dense("head", width, vocab, seed + 2)
    missing = set(model.state_dict()) - set(state)
    extra = set(state) - set(model.state_dict())
    if missing or extra:
        raise RuntimeError(f"initial state: missing {sorted(missing)}, unknown {sorted(extra)}")
    return state


def warmup_cosine_lr(step, warmup_steps, total_steps, peak, minimum):  # nn/lr_schedule.cpp
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    if step >= total_steps:
        return minimum
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return minimum + 0.5 * (peak - minimum) * (1.0 + math.cos(math.pi * progress))


def windows(tokens, starts, context):
    """ids [B, T] and targets [B, T] (the next tokens) of `tokens` (on its device) at `starts`."""
    index = torch.as_tensor(starts, dtype=torch.int64, device=tokens.device)[:, None] + \
        torch.arange(context + 1, device=tokens.device)
    w = tokens[index]
    return w[:, :-1], w[:, 1:]


def parse_args():
    p = argparse.ArgumentParser(description="PyTorch eager and torch.compile on samples/gpt's GPT, data and optimizer")
    p.add_argument("--data", default="/usr/share/games/fortunes", help="a text file, or a directory of them")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--validation-fraction", type=float, default=0.1)
    p.add_argument("--eval-interval", type=int, default=100)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", default="cuda", help="cuda (default), or cpu for a check without a GPU")
    p.add_argument("--no-compile", action="store_true", help="eager mode only (skip torch.compile)")
    p.add_argument("--no-eager", action="store_true", help="torch.compile only")
    p.add_argument("--compile-mode", default="default",
                   help="torch.compile's mode: default, reduce-overhead (CUDA graphs), max-autotune, ...")
    a = p.parse_args()
    if a.steps < 0 or a.batch_size < 1 or a.eval_interval < 1 or a.width % a.heads:
        p.error("--steps must be non-negative, --batch-size and --eval-interval positive, --width a multiple of --heads")
    return a


def main():
    a = parse_args()
    t_start = time.perf_counter()
    data = a.data
    bundled = "/tmp/tessera-gpu/data/fortunes"
    if not os.path.exists(data) and data == "/usr/share/games/fortunes" and os.path.isdir(bundled):
        print(f"{data} is missing: using the bundle's copy {bundled}")
        data = bundled
    corpus = Corpus(data, a.validation_fraction)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("gpt_gpu_peers: CUDA is not available (use --device cpu for a check without a GPU)")
    # f32 GEMMs in f32 (PyTorch's default; said again). The legacy setter sets the newer
    # fp32_precision flag with it, so PyTorch 2.9+ sees no mix of the two APIs (inductor checks
    # that). cuDNN is left alone: this model runs no convolution or RNN.
    torch.backends.cuda.matmul.allow_tf32 = False

    warmup = min(a.warmup, a.steps)
    train_starts = [random_window_starts(len(corpus.train), a.batch_size, a.context,
                                         MT19937_64((a.seed * 1000003 + step) & MASK64)) for step in range(a.steps)]
    rng = MT19937_64((a.seed * 7919 + 1) & MASK64)
    validation_starts = [random_window_starts(len(corpus.validation), a.batch_size, a.context, rng)
                         for _ in range(a.eval_batches)]
    train_tokens, validation_tokens = corpus.train.to(dev), corpus.validation.to(dev)
    validation_batches = [windows(validation_tokens, s, a.context) for s in validation_starts]

    template = Gpt(corpus.vocab, a.context, a.layers, a.width, a.heads)
    initial = tessera_initial_state(template, a.seed, a.width)
    parameter_count = sum(v.numel() for v in initial.values())
    print(f"{data}: {corpus.size} characters ({len(corpus.train)} train / {len(corpus.validation)} validation), "
          f"vocabulary {corpus.vocab}")
    name = torch.cuda.get_device_name(dev) if cuda else "CPU"
    print(f"GPT: {a.layers} layers, width {a.width}, {a.heads} heads, context {a.context}: {parameter_count} parameters; "
          f"batch {a.batch_size}, {a.steps} steps; PyTorch {torch.__version__} on {name}, f32 (TF32 off); "
          f"setup {time.perf_counter() - t_start:.1f} s")
    sys.stdout.flush()
    tokens_per_step = a.batch_size * a.context

    def run(mode):
        torch.manual_seed(a.seed)
        model = Gpt(corpus.vocab, a.context, a.layers, a.width, a.heads)
        model.load_state_dict(initial)
        model.to(dev)
        params = list(model.parameters())
        opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=a.weight_decay)

        def loss_of(ids, targets):
            return F.cross_entropy(model(ids).reshape(-1, corpus.vocab), targets.reshape(-1))

        step_loss = loss_of
        if mode == "compile":
            step_loss = torch.compile(loss_of, mode=None if a.compile_mode == "default" else a.compile_mode)

        def validation_loss():  # eager under no_grad in both modes (no second compile for inference)
            with torch.no_grad():
                return sum(loss_of(i, t).item() for i, t in validation_batches) / len(validation_batches)

        label = "torch eager" if mode == "eager" else f"torch.compile ({a.compile_mode})"
        print(f"--- {label} ---")
        print(f"step 0: validation loss {validation_loss():.4f} (uniform guessing: {math.log(corpus.vocab):.4f})")
        sys.stdout.flush()
        event_s, wall_s, interval_loss, interval_steps = [], [], 0.0, 0
        last_validation = float("nan")
        interval_start = time.perf_counter()
        for step in range(a.steps):
            lr = warmup_cosine_lr(step, warmup, a.steps, a.lr, a.min_lr)
            for group in opt.param_groups:
                group["lr"] = lr
            ids, targets = windows(train_tokens, train_starts[step], a.context)
            if cuda:
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
            wall = time.perf_counter()
            if cuda:
                begin.record()
            opt.zero_grad(set_to_none=True)
            loss = step_loss(ids, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, a.clip)
            opt.step()
            if cuda:
                end.record()
            value = loss.item()  # the sample reads each step's loss too
            wall_s.append(time.perf_counter() - wall)
            if cuda:
                end.synchronize()
                event_s.append(begin.elapsed_time(end) / 1e3)
            else:
                event_s.append(wall_s[-1])
            if step == 0:
                print(f"first step {wall_s[0]:.2f} s" + (" (compiling included)" if mode == "compile" else ""))
                sys.stdout.flush()
            if not math.isfinite(value):
                raise RuntimeError(f"the loss is {value} at step {step + 1}")
            interval_loss += value
            interval_steps += 1
            if (step + 1) % a.eval_interval == 0 or step + 1 == a.steps:
                seconds = time.perf_counter() - interval_start
                last_validation = validation_loss()
                print(f"step {step + 1}: train loss {interval_loss / interval_steps:.4f}, validation loss "
                      f"{last_validation:.4f}, {interval_steps * tokens_per_step / seconds:.0f} tokens/s")
                sys.stdout.flush()
                interval_loss, interval_steps = 0.0, 0
                interval_start = time.perf_counter()
        timer = "CUDA events" if cuda else "wall clock"
        if a.steps <= 2:
            print(f"summary {label}: {a.steps} steps, none after the first two to time; "
                  f"validation loss {last_validation:.4f} after step {a.steps}")
            return
        median = statistics.median(event_s[2:])
        print(f"summary {label}: median step {median * 1e3:.3f} ms ({timer}; wall {statistics.median(wall_s[2:]) * 1e3:.3f} ms) "
              f"over {len(event_s) - 2} steps after the first two, {tokens_per_step / median:.0f} tokens/s, "
              f"validation loss {last_validation:.4f} after step {a.steps}")
        sys.stdout.flush()

    modes = ([] if a.no_eager else ["eager"]) + ([] if a.no_compile else ["compile"])
    status = 0
    for mode in modes:
        start = time.perf_counter()
        try:
            if mode == "compile" and not hasattr(torch, "compile"):
                raise RuntimeError(f"torch.compile is missing from PyTorch {torch.__version__}")
            run(mode)
        except Exception as error:  # report and go on: the other mode's numbers still count
            print(f"{mode} FAILED: {type(error).__name__}: {str(error)[:2000]}")
            if mode == "eager":
                status = 1
        print(f"({mode}: {time.perf_counter() - start:.1f} s in all)")
        sys.stdout.flush()
    return status


if __name__ == "__main__":
    sys.exit(main())
