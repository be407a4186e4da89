#!/usr/bin/env python3
"""Regenerate the shipped batch-time profiles (profiles/*.toml) from published GPU data.

    python scripts/derive_profiles.py            # rewrite profiles/ from the reference data
    python scripts/derive_profiles.py --check    # change nothing; exit 1 if a profile drifted

The data is Vidur's per-operator profiling (../shared/reference/vidur-profiling by default,
``--reference DIR`` to override): milliseconds per transformer layer for the linear
operators at many token loads. A forward step is the per-layer sum times the number of
layers plus the embedding once; ``fairserve.sim.fit`` fits ``t = c + a·max(0, b − b0)`` to
it. What the data lacks (attention, per-step overhead, memory) is estimated from public
hardware numbers, and every profile's provenance says which numbers are which.

Run it after changing the derivation and commit the result; tests run ``--check`` whenever
the reference data sits beside the repository.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_REFERENCE = REPO.parent / "shared" / "reference" / "vidur-profiling"
DATA_COMMIT = "7d47513"
# When this derivation last changed (not today's date: regenerating must not drift).
DERIVED_ON = "2026-11-21"
# SGLang's static memory fraction is close to this on a single 80 GB GPU.
MEMORY_FRACTION = 0.9
# Scheduler, sampling and kernel launch per step; the LM head (last token per sequence).
STEP_OVERHEAD_S = 0.003
FP16_BYTES = 2
SIGNIFICANT_DIGITS = 6
PROVENANCE_WIDTH = 92
LAYER_OPS = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)

sys.path.insert(0, str(REPO / "cli"))
from fairserve.sim.fit import PiecewiseLinearFit, fit_piecewise_linear  # noqa: E402
from fairserve.sim.profile import Profile, profile_to_toml  # noqa: E402


@dataclass(frozen=True)
class Gpu:
    """Public numbers of one GPU; ``budget_tokens`` is SGLang's chunked-prefill default."""

    name: str
    memory_mib: int
    hbm_bytes_per_s: float
    fp16_tensor_flops: float
    budget_tokens: int
    note: str = ""


@dataclass(frozen=True)
class Model:
    """A Llama-family shape; enough to count weights, FLOPs and KV bytes."""

    hf_name: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int
    tied_embeddings: bool

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def layer_params(self) -> int:
        """Weights one token passes through (and one step reads) in all layers."""
        attention = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_heads * self.head_dim
        per_layer = attention + 3 * self.hidden * self.ffn + 2 * self.hidden
        return self.layers * per_layer

    @property
    def weight_bytes(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return FP16_BYTES * (self.layer_params + embeddings + self.hidden)

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * FP16_BYTES


GPUS = {
    "a100": Gpu("NVIDIA A100-SXM4-80GB", 81920, 2.039e12, 312e12, 8192),
    "h100": Gpu("NVIDIA H100 80GB HBM3", 81559, 3.35e12, 989e12, 8192),
    "a40": Gpu("NVIDIA A40", 46068, 0.696e12, 149.7e12, 4096),
    "a10g": Gpu(
        "NVIDIA A10G",
        23028,
        0.600e12,
        70e12,
        2048,
        note="70 TFLOPS is the dense fp16 peak published for AWS's A10G (the A10 lists 125).",
    ),
}
MODELS = {
    "llama-3-8b": Model("meta-llama/Meta-Llama-3-8B", 32, 4096, 14336, 32, 8, 128256, False),
    "llama-2-7b": Model("meta-llama/Llama-2-7b-hf", 32, 4096, 11008, 32, 32, 32000, False),
    "llama-3.2-3b": Model("meta-llama/Llama-3.2-3B", 28, 3072, 8192, 24, 8, 128256, True),
}
# Profiles fitted directly to a data folder: (profile name, gpu, model, folder).
MEASURED = (
    ("a100-llama-3-8b", "a100", "llama-3-8b", "a100_meta-llama_Meta-Llama-3-8B"),
    ("a100-llama-2-7b", "a100", "llama-2-7b", "a100_meta-llama_Llama-2-7b-hf"),
    ("h100-llama-2-7b", "h100", "llama-2-7b", "h100_meta-llama_Llama-2-7b-hf"),
    ("a40-llama-2-7b", "a40", "llama-2-7b", "a40_meta-llama_Llama-2-7b-hf"),
)
# Profiles with no published data, scaled from a fitted one: (name, gpu, model, source).
SCALED = (("a10g-llama-3.2-3b", "a10g", "llama-3.2-3b", "a40-llama-2-7b"),)
# Profiles of a paper's testbed: scaled as above, with the KV pool the paper states.
PAPER_POOLS = (
    (
        "a10g-llama-2-7b",
        "a10g",
        "llama-2-7b",
        "a40-llama-2-7b",
        10_000,
        "the VTC paper's own pool (Sheng et al., §5.1 and footnote 7: Llama-2-7B on an A10G "
        "24 GB under S-LoRA, 'in total 10000 tokens for KV cache')",
        "Check against the VTC paper (not a fit): Fig. 4 calls 15, 30 and 90 requests/min of "
        "256 in / 256 out 2/13, 4/13 and over 7/13 of the capacity, i.e. ~97 requests/min; "
        "simulated on this profile (one client, overloaded, fcfs, 300 s) it serves 94 "
        "requests/min. The engine modelled is SGLang's, not S-LoRA's.",
    ),
)


def step_times(folder: Path, model: Model) -> tuple[list[float], list[float]]:
    """(token loads, forward-step seconds) from the tensor-parallel-1 rows of mlp.csv."""
    loads: list[float] = []
    times: list[float] = []
    with (folder / "mlp.csv").open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row["num_tensor_parallel_workers"] != "1":
                continue
            _check_shape(row, model, folder)
            layer_ms = sum(float(row[f"time_stats.{op}.median"]) for op in LAYER_OPS)
            step_ms = model.layers * layer_ms + float(row["time_stats.emb.median"])
            loads.append(float(row["num_tokens"]))
            times.append(step_ms / 1000.0)
    return loads, times


def _check_shape(row: dict[str, str], model: Model, folder: Path) -> None:
    shape = (model.heads, model.kv_heads, model.hidden, model.ffn)
    found = tuple(int(row[k]) for k in ("n_head", "n_kv_head", "n_embd", "n_expanded_embd"))
    if found != shape:
        raise SystemExit(f"{folder}: model shape {found} is not {model.hf_name}'s {shape}")


def fit_folder(folder: Path, model: Model, budget_tokens: int) -> tuple[PiecewiseLinearFit, float]:
    """Fit over the loads a worker runs at (up to its token budget); also the largest load."""
    loads, times = step_times(folder, model)
    kept = [(b, t) for b, t in zip(loads, times, strict=True) if b <= budget_tokens]
    return fit_piecewise_linear([b for b, _ in kept], [t for _, t in kept]), max(loads)


def _round(value: float) -> float:
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")


def kv_capacity_tokens(gpu: Gpu, model: Model) -> int:
    free_bytes = gpu.memory_mib * 2**20 * MEMORY_FRACTION - model.weight_bytes
    return int(free_bytes // model.kv_bytes_per_token)


def attention_s_per_token(gpu: Gpu, model: Model) -> float:
    return _round(model.kv_bytes_per_token / gpu.hbm_bytes_per_s)


def common_provenance(gpu: Gpu, model: Model) -> list[str]:
    """The estimated parts every profile shares, with their numbers."""
    kv_bytes = model.kv_bytes_per_token
    return [
        "Estimated, not measured:",
        f"- attention_s_per_token (attention is not in the data): {kv_bytes} KV bytes per "
        f"context token (2 x {model.layers} layers x {model.kv_heads} KV heads x "
        f"{model.head_dim} x 2 B fp16) / {gpu.hbm_bytes_per_s / 1e12:g} TB/s HBM bandwidth, "
        "the memory-bound cost of reading the cache in decode; prefill attention FLOPs are "
        "not modelled.",
        f"- step_overhead_s = {STEP_OVERHEAD_S * 1000:g} ms for the scheduler, sampling and "
        "kernel launch; it also stands in for the LM head (one token per sequence; not in "
        "the data).",
        f"- kv_capacity_tokens = ({gpu.memory_mib} MiB x {MEMORY_FRACTION} memory fraction - "
        f"{model.weight_bytes / 1e9:.2f} GB fp16 weights) / {kv_bytes} B per token.",
        f"- max_batch_tokens = {gpu.budget_tokens}, SGLang's default chunked-prefill size for "
        "this GPU memory.",
        "- engine: the times are PyTorch operator timings, not an SGLang run; SGLang's "
        "defaults (token budget, memory fraction) are the ones applied.",
    ]


def measured_profile(name: str, gpu: Gpu, model: Model, folder: Path) -> Profile:
    fit, top = fit_folder(folder, model, gpu.budget_tokens)
    extrapolated = (
        f" (the data stops at {top:g} tokens; above it the fit is extrapolated)"
        if top < gpu.budget_tokens
        else ""
    )
    paragraphs = [
        f"Derived from Vidur's published profiling data (MIT licence, commit {DATA_COMMIT}), "
        f"{folder.name}/mlp.csv, tensor-parallel-1 rows, median times: the per-layer linear "
        f"operators ({', '.join(LAYER_OPS)}) summed, x {model.layers} layers, + emb once; "
        f"t = c + a*max(0, b - b0) fitted by least squares over the {fit.points} rows with "
        f"num_tokens <= {gpu.budget_tokens}{extrapolated}.",
        f"GPU: the data names only {folder.name.split('_')[0]!r}; {gpu.name} is assumed.",
        *common_provenance(gpu, model),
    ]
    return _profile(name, gpu, model, fit, paragraphs)


def scaled_profile(name: str, gpu: Gpu, model: Model, base: Profile, base_model: Model) -> Profile:
    """No published data: scale a fitted profile by model size and GPU speed (estimated)."""
    base_gpu = next(g for g in GPUS.values() if g.name == base.gpu)
    params = model.layer_params / base_model.layer_params
    memory_speed = base_gpu.hbm_bytes_per_s / gpu.hbm_bytes_per_s
    compute_speed = base_gpu.fp16_tensor_flops / gpu.fp16_tensor_flops
    c_scale = params * memory_speed  # below b0 a step reads the weights once
    a_scale = params * compute_speed  # above b0 each token costs 2 FLOPs per weight
    fit = PiecewiseLinearFit(
        c_s=base.c_s * c_scale,
        a_s_per_token=base.a_s_per_token * a_scale,
        b0_tokens=round(base.b0_tokens * c_scale / a_scale),
        r2=base.fit_r2 or 0.0,
        points=base.fit_points or 0,
    )
    ratio = f"{base_gpu.name} / {gpu.name}"
    paragraphs = [
        f"ESTIMATED: there is no published data for {model.hf_name} on {gpu.name}. Scaled "
        f"from the {base.name} profile (itself derived from Vidur's data):",
        f"- c_s x {c_scale:.4f} = layer-weight ratio {params:.4f} x HBM bandwidth ratio "
        f"{ratio} ({base_gpu.hbm_bytes_per_s / 1e12:g}/{gpu.hbm_bytes_per_s / 1e12:g} TB/s): "
        "below b0 a step is bound by reading the weights.",
        f"- a_s_per_token x {a_scale:.4f} = layer-FLOP ratio {params:.4f} x fp16 tensor peak "
        f"ratio {ratio} ({base_gpu.fp16_tensor_flops / 1e12:g}/"
        f"{gpu.fp16_tensor_flops / 1e12:g} TFLOPS): above b0 a step is compute-bound. "
        f"{gpu.note}",
        "- b0_tokens x c-scale / a-scale: the roofline ridge moves with both.",
        f"- [fit] r2 and points are those of the {base.name} fit, before scaling.",
        *common_provenance(gpu, model),
    ]
    return _profile(name, gpu, model, fit, paragraphs)


def _wrap(paragraphs: list[str]) -> str:
    """Provenance text: one wrapped paragraph or bullet per entry, ending in a newline."""
    lines: list[str] = []
    for paragraph in paragraphs:
        indent = "  " if paragraph.startswith("- ") else ""
        lines += textwrap.wrap(
            paragraph.strip(),
            PROVENANCE_WIDTH,
            subsequent_indent=indent,
            break_long_words=False,
            break_on_hyphens=False,
        )
    return "\n".join(lines) + "\n"


def _profile(
    name: str, gpu: Gpu, model: Model, fit: PiecewiseLinearFit, paragraphs: list[str]
) -> Profile:
    return Profile(
        name=name,
        gpu=gpu.name,
        model=model.hf_name,
        engine="sglang",
        date=DERIVED_ON,
        source="derived-from-published-data",
        provenance=_wrap(paragraphs),
        tensor_parallel=1,
        c_s=_round(fit.c_s),
        a_s_per_token=_round(fit.a_s_per_token),
        b0_tokens=fit.b0_tokens,
        attention_s_per_token=attention_s_per_token(gpu, model),
        step_overhead_s=STEP_OVERHEAD_S,
        kv_capacity_tokens=kv_capacity_tokens(gpu, model),
        max_batch_tokens=gpu.budget_tokens,
        fit_r2=round(fit.r2, SIGNIFICANT_DIGITS),
        fit_points=fit.points,
    )


def derive(reference: Path) -> dict[str, Profile]:
    """Every shipped profile, by name."""
    profiles: dict[str, Profile] = {}
    for name, gpu, model, folder in MEASURED:
        profiles[name] = measured_profile(name, GPUS[gpu], MODELS[model], reference / folder)
    for name, gpu, model, base in SCALED:
        base_model = next(MODELS[m] for n, _, m, _ in MEASURED if n == base)
        profiles[name] = scaled_profile(name, GPUS[gpu], MODELS[model], profiles[base], base_model)
    for name, gpu, model, base, kv_tokens, source, check in PAPER_POOLS:
        base_model = next(MODELS[m] for n, _, m, _ in MEASURED if n == base)
        scaled = scaled_profile(name, GPUS[gpu], MODELS[model], profiles[base], base_model)
        profiles[name] = with_pool(scaled, GPUS[gpu], MODELS[model], kv_tokens, source, check)
    return profiles


def with_pool(
    profile: Profile, gpu: Gpu, model: Model, kv_tokens: int, source: str, check: str
) -> Profile:
    """``profile`` with a paper's KV pool instead of SGLang's default, saying so."""
    default = kv_capacity_tokens(gpu, model)
    bullet = "- kv_capacity_tokens = ("
    start = profile.provenance.index(bullet)
    end = profile.provenance.index("per token.\n", start) + len("per token.\n")
    pool = _wrap(
        [
            f"- kv_capacity_tokens = {kv_tokens}: {source}, not SGLang's default for this GPU "
            f"(({gpu.memory_mib} MiB x {MEMORY_FRACTION} memory fraction - "
            f"{model.weight_bytes / 1e9:.2f} GB fp16 weights) / {model.kv_bytes_per_token} B "
            f"per token = {default})."
        ]
    )
    text = profile.provenance[:start] + pool + profile.provenance[end:] + _wrap([check])
    return dataclasses.replace(profile, provenance=text, kv_capacity_tokens=kv_tokens)


def render(reference: Path) -> dict[str, str]:
    """File name -> TOML text of every shipped profile."""
    return {f"{name}.toml": profile_to_toml(p) for name, p in derive(reference).items()}


def drift(out: Path, files: dict[str, str]) -> list[Path]:
    """Files under ``out`` whose text differs from (or is missing for) ``files``."""
    drifted = []
    for file_name, text in files.items():
        path = out / file_name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            drifted.append(path)
    return drifted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--reference", type=Path, default=DEFAULT_REFERENCE, help="vidur-profiling folder"
    )
    parser.add_argument(
        "--out", type=Path, default=REPO / "profiles", help="profiles folder (default: repo's)"
    )
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if a profile drifted"
    )
    args = parser.parse_args(argv)
    if not args.reference.is_dir():
        print(f"error: reference data not found: {args.reference}", file=sys.stderr)
        return 2
    files = render(args.reference)
    if args.check:
        drifted = drift(args.out, files)
        for path in drifted:
            print(f"drifted: {path}", file=sys.stderr)
        if drifted:
            print("run: python scripts/derive_profiles.py", file=sys.stderr)
        return 1 if drifted else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for file_name, text in files.items():
        (args.out / file_name).write_text(text, encoding="utf-8")
        print(f"wrote {args.out / file_name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
