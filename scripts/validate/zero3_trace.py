"""What DeepSpeed 0.8.0's ZeRO-3 keeps gathered, step by step, for peft's LoRA examples.

Replays the rules of its PartitionedParameterCoordinator (fetch_sub_module, release_sub_module,
__params_to_release: the prefetch of `stage3_prefetch_bucket_size` elements at every module's
fetch up to `stage3_max_live_parameters`, the release unless the parameter comes back within
`stage3_max_reuse_distance`, tensors of at most `stage3_param_persistence_threshold` never
partitioned) over the module trace of a real run: the model built small with the same modules
(forward and backward hooks as DeepSpeed registers them record the order of fetches and
releases), sized from the real config on the meta device. Prints the elements gathered at the
end of the forward, at the backward's first fetch and at most — the figures
`deepspeed::tests::the_turn_holds_what_deepspeeds_coordinator_holds` holds the planner to.

    .venv/bin/python scripts/validate/zero3_trace.py t0|mt0|bloom
"""
import sys, collections, torch
from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoModelForCausalLM
from peft import LoraConfig, get_peft_model, TaskType

which = sys.argv[1]
REAL = {
 "t0": dict(model_type="t5", d_model=2048, d_ff=5120, d_kv=64, num_heads=32, num_layers=24, num_decoder_layers=24,
            vocab_size=32128, feed_forward_proj="gated-gelu", tie_word_embeddings=False, decoder_start_token_id=0, pad_token_id=0),
 "mt0": dict(model_type="mt5", d_model=4096, d_ff=10240, d_kv=64, num_heads=64, num_layers=24, num_decoder_layers=24,
            vocab_size=250112, feed_forward_proj="gated-gelu", tie_word_embeddings=False, decoder_start_token_id=0, pad_token_id=0),
 "bloom": dict(model_type="bloom", hidden_size=4096, n_layer=30, n_head=32, vocab_size=250880),
}[which]
seq2seq = which != "bloom"
def tiny(c):
    c = dict(c)
    if seq2seq: c.update(d_model=64, d_ff=96, d_kv=8, num_heads=8, vocab_size=512)
    else: c.update(hidden_size=64, n_head=8, vocab_size=512)
    return c
def build(c, device):
    cfg = AutoConfig.for_model(**c)
    with torch.device(device):
        m = (AutoModelForSeq2SeqLM if seq2seq else AutoModelForCausalLM).from_config(cfg)
    return get_peft_model(m, LoraConfig(task_type=TaskType.SEQ_2_SEQ_LM if seq2seq else TaskType.CAUSAL_LM, r=8, lora_alpha=32, lora_dropout=0.1))
real = build(REAL, "meta")
numel = {n: p.numel() for n, p in real.named_parameters()}
model = build(tiny(REAL), "cpu"); model.train()
names = {id(p): n for n, p in model.named_parameters()}
trace = []  # ("fwd"/"bwd", module name, [param names]) by fetch order; releases as ("rel", name)
def direct(m): return [names[id(p)] for p in m.parameters(recurse=False)]
class Pre(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, t): ctx.name = name; return t.view_as(t)
    @staticmethod
    def backward(ctx, g): trace.append(("bwd", ctx.name)); return None, g
class Post(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, t): ctx.name = name; return t.view_as(t)
    @staticmethod
    def backward(ctx, g): trace.append(("relb", ctx.name)); return None, g
mods = dict(model.named_modules())
def wrap(obj, fn, name):
    if isinstance(obj, torch.Tensor):
        return fn.apply(name, obj) if obj.requires_grad and obj.is_floating_point() else obj
    if isinstance(obj, tuple): return tuple(wrap(o, fn, name) for o in obj)
    if isinstance(obj, list): return [wrap(o, fn, name) for o in obj]
    if hasattr(obj, "to_tuple") and hasattr(obj, "keys"):
        for k in list(obj.keys()): obj[k] = wrap(obj[k], fn, name)
        return obj
    if isinstance(obj, dict): return {k: wrap(v, fn, name) for k, v in obj.items()}
    return obj
for n, m in mods.items():
    def pre(m, args, kwargs, n=n):
        trace.append(("fwd", n))
        return wrap(args, Post, n), wrap(kwargs, Post, n)
    def post(m, args, kwargs, out, n=n):
        trace.append(("relf", n))
        return wrap(out, Pre, n)
    m.register_forward_pre_hook(pre, with_kwargs=True)
    m.register_forward_hook(post, with_kwargs=True)
torch.manual_seed(0)
B, S = 8, 64
ids = torch.randint(1, 512, (B, S))
if seq2seq:
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=torch.randint(1, 512, (B, 4)))
else:
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids)
out.loss.backward()
# DeepSpeed: params <= 1e5 elements persist (never partitioned).
THR = 1e5
P = {n: numel[n] for n in numel}
persist = {n for n, k in P.items() if k <= THR}
# module order (fetch events), with direct params (DeepSpeed iter_params(module) recurse=False)
order = [(kind, n) for kind, n in trace if kind in ("fwd", "bwd")]
mparams = {n: [p for p in direct(mods[n])] for n in mods}
# release counting in backward: PostBackwardFunction fires once per input tensor wrapped; DS releases when all fired.
# Simplify: release at the first relb event after the module's bwd fetch (DeepSpeed: ds_grads_remaining == 0).
events = []
for kind, n in trace:
    events.append((kind, n))
PREFETCH, REUSE, MAXLIVE = 5e7, 1e9, 1e9
steps = [n for k, n in events if k in ("fwd", "bwd")]
queue = collections.deque()
for s, n in enumerate(steps):
    for p in sorted(mparams[n]):
        queue.append((p, s))
avail = set(persist)
n_avail = 0
most_recent = collections.defaultdict(lambda: -10**10)
active = collections.defaultdict(set)
step = 0
live_max = (0, None)
def gathered(): return sum(P[p] for p in avail if p not in persist)
hist = []
for kind, n in events:
    if kind in ("fwd", "bwd"):
        ps = mparams[n]
        for p in ps:
            if p not in avail: avail.add(p); n_avail += P[p]
            active[p].add(n)
        not_fetched = {p for p in ps if most_recent[p] < step}
        disc = set()
        while queue and len(disc) < len(not_fetched):
            p, s = queue.popleft(); most_recent[p] = s; disc.add(p)
        maxp = min(MAXLIVE - n_avail, PREFETCH); num = 0; pref = set()
        while queue and num < maxp:
            p, s = queue.popleft()
            do = p not in avail and p not in pref
            most_recent[p] = max(most_recent[p], s)
            if do: pref.add(p); num += P[p]
        for p in pref: avail.add(p); n_avail += P[p]
        step += 1
        g = gathered()
        hist.append((step, kind, n, g))
        if g > live_max[0]:
            live_max = (g, (kind, n, step)); snap = sorted(((P[p], p) for p in avail if p not in persist), reverse=True)
    elif kind in ("relf", "relb"):
        # release_sub_module(n) with current step id
        rel = {p for p in mparams[n] if p not in persist}
        for p in mparams[n]:
            if most_recent[p] > step: rel.discard(p)
        trav = 0
        for m in steps[step:]:
            if trav >= REUSE: break
            for p in mparams[m]:
                rel.discard(p); trav += P[p]
        for p in mparams[n]:
            active[p].discard(n)
            if p in rel and p in avail and not active[p]:
                avail.discard(p); n_avail -= P[p]
nf = sum(1 for k, _ in events if k == "fwd")
turn = [h for h in hist if h[1] == "bwd"][0]
end_fwd = [h for h in hist if h[1] == "fwd"][-1]
print(which, "modules fwd", nf, "bwd", sum(1 for k,_ in events if k=="bwd"))
print("gathered at end of forward %.3e, at first backward fetch %.3e, max %.3e at %s" % (end_fwd[3], turn[3], live_max[0], live_max[1]))
big = sorted(((P[p], p) for p in avail if p not in persist), reverse=True)[:5]
print("still gathered after the step: %.3e" % gathered(), big)
print(len(snap), "gathered at max; largest:", snap[:6], "smallest:", snap[-3:])
