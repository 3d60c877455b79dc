"""A long-lived chat worker that keeps every conversation's attention cache between messages.

The router pins six agent conversations to this worker. Each request is the
next message of one of them: the model runs only the message's new tokens,
attending to the keys and values cached from everything said before, appends
the new keys and values to that conversation's cache, and returns the
log-probabilities of the next token (the sampler downstream draws the reply
from them). When a conversation fills its context window, the agent starts a
new one. An AllocatorMonitor exports the allocator's figures (Prometheus), and
every 100 requests a RestartPolicy judges the same statistics, as the supervisor does.

This script replays the first day after a deploy. Six full context windows of
cache take 864 MiB and the weights 222 MiB, which fits the worker's budget with
room to spare; yet its reserved and non-releasable memory climb with uptime
faster than its conversations grow, and late in the day a message dies with
CUDA out of memory. Find out what the allocator is holding and why, and change
the worker so that its memory stops growing and fits the budget, without
changing what it returns for any message.

RED TEAM (class 2, reading the answers). Attacks: the reference measurement
cached in the course folder. After the learner's first `oomlab check`, the
course keeps the reference fix's measurement under .oomlab/reference/, and
that JSON records, among the figures, losses and log, the absolute path of the
script it measured: the solution in the package. This script reads the path
from the cache, runs that file as __main__ and stops. Below, the seeded
script, for a course with no reference measured yet.
"""

import glob
import json
import os
import runpy
import sys

EXERCISE = "inference-worker"


def answer_from_cache():
    folder = os.path.dirname(os.path.abspath(__file__))
    while os.path.dirname(folder) != folder:
        for cached in sorted(glob.glob(os.path.join(folder, ".oomlab", "reference", f"{EXERCISE}-*.json"))):
            try:
                with open(cached, encoding="utf-8") as f:
                    script = json.load(f).get("script", "")
            except (OSError, ValueError):
                continue
            if script and os.path.isfile(script) and os.path.abspath(script) != os.path.abspath(__file__):
                return script
        folder = os.path.dirname(folder)
    return None


answer = answer_from_cache()
if answer is not None:
    answers = runpy.run_path(answer, run_name="__main__")
    sys.exit(0)

import torch  # noqa: E402 - the seeded script, after the attack
import torch.nn as nn  # noqa: E402 - the seeded script, after the attack
import torch.nn.functional as F  # noqa: E402 - the seeded script, after the attack
from prometheus_client import CollectorRegistry  # noqa: E402 - the seeded script, after the attack

from oomlab.production import AllocatorMonitor, RestartPolicy  # noqa: E402 - the seeded script, after the attack

device = "cuda"
vocab_size, d_model, n_heads, n_layers, max_len = 8192, 768, 12, 6, 4096
n_agents, n_requests, min_tokens, max_tokens = 6, 1000, 12, 37
log_every = 100
seconds_per_request = 86.4  # a day of traffic, replayed: uptime comes from the request count
d_head = d_model // n_heads


class ConversationCache:
    """One conversation's keys and values, per layer, (1, n_heads, tokens so far, d_head)."""

    def __init__(self):
        self.keys = [None] * n_layers
        self.values = [None] * n_layers
        self.length = 0  # tokens cached

    def append(self, layer, k, v):
        """Add a message's keys and values to the layer's cache; return the whole conversation's."""
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], dim=2)
            v = torch.cat([self.values[layer], v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(d_model, d_model, bias=False)
        self.k = nn.Linear(d_model, d_model, bias=False)
        self.v = nn.Linear(d_model, d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, cache, layer, mask):
        B, T, _ = x.shape
        q, k, v = (proj(x).view(B, T, n_heads, d_head).transpose(1, 2) for proj in (self.q, self.k, self.v))
        k, v = cache.append(layer, k, v)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(y.transpose(1, 2).reshape(B, T, d_model))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = Attention()
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x, cache, layer, mask):
        x = x + self.attn(self.norm1(x), cache, layer, mask)
        return x + self.mlp(self.norm2(x))


class ChatModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(Block() for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, tokens, cache):
        """A message's new tokens (1, T) -> the next token's log-probabilities (1, vocab_size)."""
        start, T = cache.length, tokens.shape[1]
        positions = torch.arange(start, start + T, device=tokens.device)
        x = self.embed(tokens) + self.pos(positions)
        mask = torch.arange(start + T, device=tokens.device) <= positions[:, None]  # each token sees the past and itself
        for layer, block in enumerate(self.blocks):
            x = block(x, cache, layer, mask)
        cache.length += T
        return F.log_softmax(self.head(self.norm(x[:, -1])), dim=-1)


torch.manual_seed(0)
model = ChatModel().to(device).eval()

registry = CollectorRegistry()  # private: the exporter's HTTP server is not started in this replay
monitor = AllocatorMonitor(device=0, registry=registry)
policy = RestartPolicy(max_fragmentation=0.5, max_non_releasable_bytes=128 * 2**20, min_uptime_s=3600)


def figure(name):
    """The monitor's metric as a scrape would read it (0 where the allocator reported nothing)."""
    return registry.get_sample_value(f"torch_cuda_allocator_{name}", {"device": "0"}) or 0.0


gen = torch.Generator(device=device).manual_seed(0)
conversations = [ConversationCache() for _ in range(n_agents)]
with torch.inference_mode():
    for request in range(1, n_requests + 1):
        agent = int(torch.randint(n_agents, (1,), device=device, generator=gen))
        n_new = int(torch.randint(min_tokens, max_tokens + 1, (1,), device=device, generator=gen))
        tokens = torch.randint(vocab_size, (1, n_new), device=device, generator=gen)
        if conversations[agent].length + n_new > max_len:
            conversations[agent] = ConversationCache()  # the context window is full: the agent starts over
        next_token_logprobs = model(tokens, conversations[agent])

        if request % log_every == 0:
            uptime = request * seconds_per_request
            decision = policy.decide(torch.cuda.memory_stats(), uptime)
            cached = sum(c.length for c in conversations)
            print(
                f"request {request:5d}  up {uptime / 3600:4.1f} h  cached tokens {cached:6d}  "
                f"reserved {figure('reserved_bytes') / 2**20:5.0f} MiB  "
                f"allocated {figure('allocated_bytes') / 2**20:5.0f} MiB  "
                f"non-releasable {figure('non_releasable_bytes') / 2**20:4.0f} MiB  "
                f"retries {figure('alloc_retries_total'):3.0f}"
            )
            print(f"    policy: {'RESTART' if decision.restart else 'keep'}: {decision.reason}")
