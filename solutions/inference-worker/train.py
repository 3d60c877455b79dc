"""A long-lived inference worker that serves per-token embeddings.

Each request is a batch of documents from one client, padded to its longest
document. The worker runs the encoder and keeps the response, one embedding
per token, on the GPU until the client collects it a few requests later. An
AllocatorMonitor exports the allocator's figures (Prometheus) and a
RestartPolicy reads them every 100 requests, the way the supervisor does in
production.

This script replays a day of that traffic. The worker never holds more than a
few hundred MiB of tensors at once, yet its reserved and non-releasable memory
climb with uptime until a request dies with CUDA out of memory. Find out what
the allocator is holding and why, and change the worker so that its memory
levels off, without changing what it returns for any request.
"""

from collections import deque

import torch
import torch.nn as nn
import torch.nn.functional as F
from prometheus_client import CollectorRegistry

from oomlab.production import AllocatorMonitor, RestartPolicy

device = "cuda"
vocab_size, d_model, d_hidden, n_layers, d_embed = 8192, 1024, 4096, 2, 256
n_requests, max_docs, min_len, max_len = 1000, 8, 32, 1024
collect_after = 32      # a client collects its response this many requests later
log_every = 100
seconds_per_request = 90.0  # a day of traffic, replayed: uptime comes from the request count


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.up = nn.Linear(d_model, d_hidden)
        self.down = nn.Linear(d_hidden, d_model)

    def forward(self, h):
        return self.down(F.gelu(self.up(self.norm(h))))


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList(Block() for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.proj = nn.Linear(d_model, d_embed)

    def forward(self, tokens, mask):
        """tokens (docs, length) and mask (docs, length), 1 for real tokens: one embedding per real token, 0 at padding."""
        h = self.embed(tokens)
        for block in self.blocks:
            h = h + block(h)
        return torch.sigmoid(self.proj(self.norm(h))) * mask[..., None]


def next_request(gen):
    """One client's batch: how many documents, and each document's length, vary from request to request."""
    n_docs = int(torch.randint(1, max_docs + 1, (1,), device=device, generator=gen))
    lengths = torch.randint(min_len, max_len + 1, (n_docs,), device=device, generator=gen)
    longest = int(lengths.max())
    tokens = torch.randint(vocab_size, (n_docs, longest), device=device, generator=gen)
    return tokens, lengths


torch.manual_seed(0)
model = Encoder().to(device).eval()

registry = CollectorRegistry()  # private: the exporter's HTTP server is not started in this replay
monitor = AllocatorMonitor(device=0, registry=registry)
policy = RestartPolicy(max_fragmentation=0.5, max_non_releasable_bytes=512 * 2**20, min_uptime_s=3600)


def figure(name):
    return registry.get_sample_value(f"torch_cuda_allocator_{name}", {"device": "0"})


gen = torch.Generator(device=device).manual_seed(0)
responses = deque()  # (request id, embeddings) waiting for their client
response_slots = torch.empty(collect_after, max_docs, max_len, d_embed, device=device)
with torch.inference_mode():
    for request in range(1, n_requests + 1):
        tokens, lengths = next_request(gen)
        mask = (torch.arange(tokens.shape[1], device=device) < lengths[:, None]).float()
        while responses and responses[0][0] <= request - collect_after:
            responses.popleft()  # collected by its client
        # Each response is copied into a slot of one buffer allocated before the first request: a fresh
        # tensor of this request's shape would land in a hole between the forward's temporaries and pin
        # that segment until the client collects it, and ragged shapes never fill those holes again.
        slot = response_slots[request % collect_after, : tokens.shape[0], : tokens.shape[1]]
        responses.append((request, slot.copy_(model(tokens, mask))))

        if request % log_every == 0:
            uptime = request * seconds_per_request
            decision = policy.decide(torch.cuda.memory_stats(), uptime)
            print(
                f"request {request:5d}  up {uptime / 3600:4.1f} h  "
                f"reserved {figure('reserved_bytes') / 2**20:6.0f} MiB  "
                f"allocated {figure('allocated_bytes') / 2**20:6.0f} MiB  "
                f"non-releasable {figure('non_releasable_bytes') / 2**20:5.0f} MiB  "
                f"fragmentation {figure('fragmentation_ratio'):.0%}"
            )
            print(f"    policy: {'RESTART' if decision.restart else 'keep'}: {decision.reason}")
