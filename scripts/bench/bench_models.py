"""The PyTorch models of omps's inference benchmarks, built from seeded random weights on
the device (nothing is downloaded). It exists so that the two workers that run them share
one definition: infer_worker.py (closed-loop throughput, infer-bench.sh) and
serve_worker.py (open-loop Poisson serving, tests/gpu/test_serving.py). A builder takes the
device and returns request(): one request, enqueued on the current stream; the caller
synchronizes. Imports torch at once: a worker imports this module only for a real model.

  resnet50       torchvision ResNet-50, fp16, eval, channels-last, batch 1, 224x224.
  decoder        GPT-2-small-shaped decoder (12 layers, d_model 768, 12 heads, vocab 50257,
                 1024 positions, tied LM head), fp16, KV cache kept by hand: a 16-token
                 prompt, then greedy decoding until 32 tokens are generated, eagerly.
  graph_decoder  the same decoder; the prompt runs eagerly, each later token is one replay
                 of a torch.cuda.CUDAGraph of one decode step (static KV buffers, the next
                 position and token kept on the GPU and advanced by the graph itself).
  encoder        BERT-base-shaped encoder from torch.nn (token and position embeddings,
                 12 post-norm layers, d_model 768, 12 heads, FFN 3072, GELU), fp16,
                 batch 1, 128 tokens.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

PROMPT_LEN = 16
GEN_TOKENS = 32
LAYERS, D, HEADS, VOCAB, CTX = 12, 768, 12, 50257, 1024  # GPT-2 small
HD = D // HEADS
ENC_VOCAB, ENC_SEQ = 30522, 128                           # BERT-base


def build_resnet50(dev):
    import torchvision

    model = torchvision.models.resnet50(weights=None)
    model = model.to(device=dev, memory_format=torch.channels_last).half().eval()
    x = torch.randn(1, 3, 224, 224, device=dev).half().contiguous(memory_format=torch.channels_last)
    return lambda: model(x)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.fc, self.out = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def _qkv(self, x):
        t = x.shape[1]
        # (1, t, 3d) -> 3 x (1, heads, t, hd)
        return self.qkv(self.ln1(x)).view(1, t, 3, HEADS, HD).permute(2, 0, 3, 1, 4)

    def _rest(self, x, a):
        x = x + self.proj(a.transpose(1, 2).reshape(1, x.shape[1], D))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    def forward(self, x, kc, vc, pos):
        """Eager: pos a Python int; attends over the cache written so far."""
        t = x.shape[1]
        q, k, v = self._qkv(x)
        kc[:, :, pos:pos + t] = k
        vc[:, :, pos:pos + t] = v
        # prefill (pos == 0): causal over the prompt; decode (t == 1): all cached keys
        a = F.scaled_dot_product_attention(q, kc[:, :, :pos + t], vc[:, :, :pos + t], is_causal=t > 1)
        return self._rest(x, a)

    def step(self, x, kc, vc, where, mask):
        """Static shapes, for a CUDA graph: the positions `where` are a device tensor (t,);
        attention covers the whole cache, `mask` (t, cache length) True where a key may be
        seen. Plain matmul + softmax, so nothing in it picks a kernel by the values."""
        q, k, v = self._qkv(x)
        kc.index_copy_(2, where, k)
        vc.index_copy_(2, where, v)
        att = (q @ kc.transpose(-2, -1)) * HD ** -0.5
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        return self._rest(x, att @ vc)


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, D), nn.Embedding(CTX, D)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(D)
        for m in self.modules():  # GPT-2's initialisation
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def _logits(self, x):
        return F.linear(self.ln_f(x[:, -1]), self.wte.weight)  # logits of the last position, tied head

    def forward(self, idx, pos, positions, caches):
        t = idx.shape[1]
        assert t == 1 or pos == 0
        x = self.wte(idx) + self.wpe(positions[pos:pos + t])
        for block, (kc, vc) in zip(self.blocks, caches):
            x = block(x, kc, vc, pos)
        return self._logits(x)

    def step(self, idx, where, mask, caches):
        """Block.step for every layer: idx (1, t) at the positions `where` (t,)."""
        x = self.wte(idx) + self.wpe(where)
        for block, (kc, vc) in zip(self.blocks, caches):
            x = block.step(x, kc, vc, where, mask)
        return self._logits(x)


def _caches(dev, zeroed):
    total = PROMPT_LEN + GEN_TOKENS
    new = torch.zeros if zeroed else torch.empty
    return [(new(1, HEADS, total, HD, device=dev, dtype=torch.half),
             new(1, HEADS, total, HD, device=dev, dtype=torch.half)) for _ in range(LAYERS)]


def build_decoder(dev):
    model = Decoder().to(dev).half().eval()
    positions = torch.arange(CTX, device=dev)
    prompt = torch.randint(0, VOCAB, (1, PROMPT_LEN), device=dev)
    caches = _caches(dev, zeroed=False)
    out = torch.empty(1, GEN_TOKENS, dtype=torch.long, device=dev)

    def request():
        logits = model(prompt, 0, positions, caches)
        for i in range(GEN_TOKENS):
            tok = logits.argmax(-1, keepdim=True)  # (1, 1), greedy
            out[:, i:i + 1] = tok
            if i + 1 < GEN_TOKENS:
                logits = model(tok, PROMPT_LEN + i, positions, caches)
        return logits

    return request


def build_graph_decoder(dev):
    """One request: the prompt eagerly (it writes the caches at 0..15 and the first token),
    then GEN_TOKENS - 1 replays of the captured decode step; no host sync inside."""
    model = Decoder().to(dev).half().eval()
    total = PROMPT_LEN + GEN_TOKENS
    # zeros, not empty: a step attends over the whole buffer with the unwritten part masked,
    # and a NaN in never-written memory would survive the mask (0 * NaN)
    caches = _caches(dev, zeroed=True)
    prompt = torch.randint(0, VOCAB, (1, PROMPT_LEN), device=dev)
    kpos = torch.arange(total, device=dev)
    prompt_where = kpos[:PROMPT_LEN].clone()
    prompt_mask = kpos.view(1, total) <= prompt_where.view(PROMPT_LEN, 1)  # causal
    tok = torch.zeros(1, 1, dtype=torch.long, device=dev)    # the graph's input and output
    where = torch.zeros(1, dtype=torch.long, device=dev)     # the position it writes

    def prefill():
        logits = model.step(prompt, prompt_where, prompt_mask, caches)
        tok.copy_(logits.argmax(-1, keepdim=True))
        where.fill_(PROMPT_LEN)
        return logits

    def decode_step():
        mask = (kpos <= where).view(1, total)  # keys 0..where, the new one included
        logits = model.step(tok, where, mask, caches)
        tok.copy_(logits.argmax(-1, keepdim=True))  # greedy; the next replay reads it
        where.add_(1)
        return logits

    last = {}
    if torch.device(dev).type == "cuda":
        # warm up on a side stream before capturing, as PyTorch's CUDA-graph notes ask
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                prefill()
                decode_step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            last["logits"] = decode_step()  # static output: rewritten by every replay
        replay = graph.replay
    else:  # only to check the code without a GPU: the step runs eagerly
        def replay():
            last["logits"] = decode_step()

    def request():
        prefill()
        for _ in range(GEN_TOKENS - 1):
            replay()
        return last["logits"]

    return request


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(ENC_VOCAB, D), nn.Embedding(512, D)
        self.ln = nn.LayerNorm(D)
        layer = nn.TransformerEncoderLayer(D, HEADS, 4 * D, dropout=0.0, activation="gelu", batch_first=True)
        self.layers = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)

    def forward(self, idx, positions):
        return self.layers(self.ln(self.tok(idx) + self.pos(positions)))


def build_encoder(dev):
    model = Encoder().to(dev).half().eval()
    idx = torch.randint(0, ENC_VOCAB, (1, ENC_SEQ), device=dev)
    positions = torch.arange(ENC_SEQ, device=dev)
    return lambda: model(idx, positions)


BUILDERS = {"resnet50": build_resnet50, "decoder": build_decoder, "graph_decoder": build_graph_decoder,
            "encoder": build_encoder}


def build(name, dev):
    """request() of model `name` (a key of BUILDERS) on device `dev`."""
    return BUILDERS[name](dev)
