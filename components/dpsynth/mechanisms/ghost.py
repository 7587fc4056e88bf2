"""Per-example gradient norms without per-example gradients (ghost clipping), and the clipped sum.

A layer's weight gradient for one example is an outer product summed over the layer's T
positions (the pixels of a convolution's output, the tokens of a linear layer): with the
example's inputs A (T × p; a convolution's unfolded patches) and output gradients G (T × d),
∇W = Aᵀ G. Its squared norm needs neither ∇W nor a per-example copy of it:

    ‖Aᵀ G‖² = ⟨A Aᵀ, G Gᵀ⟩            (the "ghost norm", Goodfellow 2015; Li et al. 2022),

which costs ~T²(p + d) per example against ~T·p·d for instantiating ∇W and taking its norm.
Mixed ghost clipping (Bu et al. 2022, "Scalable and efficient training of large convolutional
neural networks with differential privacy") picks the cheaper of the two per layer
(:func:`use_ghost_norm`). Biases and the affine weights of GroupNorm/LayerNorm are small: their
per-example gradients are instantiated.

Given the per-example norms (per parameter tensor, so that dp-GAN's groups can be clipped group
by group), the clipped sum Σ_i c_i ∇ℓ_i is obtained in one of two ways:

* ``bookkeeping`` (Bu et al. 2023, "Differentially private optimization on large model at
  small cost"): one backward pass yields only the output gradients G of every layer (autograd
  is asked for them alone, so it skips the weight gradients); the weight gradient of each
  layer is then formed once from A and the rescaled c_i·G_i, with the layer's own backward
  kernel (``aten.convolution_backward`` for convolutions, one matmul for linear layers) — or,
  where the per-example gradients were instantiated for the norms and kept
  (:func:`keep_instantiated`: when they take no more memory than the layer's stored inputs and
  output gradients, e.g. a first convolution with few input channels, a last one with one
  output), as Σ_i c_i ∇W_i, one matrix-vector product, with no weight-gradient pass at all;
* ``two_pass``: the same first pass for the norms, then an ordinary backward of Σ_i c_i ℓ_i
  (one group only: a second pass per group would be needed otherwise).

Memory: the engine holds each call's input and, after the backward pass, its output gradient;
not its output (autograd is asked for the gradient at the output's edge, so the graph frees the
output as usual). A layer's norm work runs over chunks of examples (:func:`chunk_size`), so that
a convolution's patches (A, k² times its input) are never built for the whole batch; they are
copied from a channels-last view of the padded input (:func:`_patches`). In second-order mode a
call whose output gradient is zero (the forward calls that a gradient penalty reaches only through
LeakyReLU's derivative) is dropped.

Supported layers: ``nn.Linear``, ``nn.Conv2d``, ``nn.ConvTranspose2d`` (zero padding, groups = 1),
``nn.Embedding``, ``nn.GroupNorm``, ``nn.LayerNorm``. Any other module that owns a trainable
parameter, and any spectral-norm-wrapped layer (its weight is a function of a parameter through
a power iteration, so ∇W is not the parameter's gradient), is refused by name when the engine
is built. A layer may run several times in one forward pass (its per-example gradient is then
the sum over its calls; the calls are stacked along T).

Losses with an input-gradient term (WGAN-GP's penalty ‖∇_x D(x)‖, dp-GAN's critic): with
``second_order=True`` the Linear and Conv2d layers compute their input gradient, when autograd
differentiates through it (``create_graph``), as a recorded *transposed use* of the same weight
(x·Wᵀ's input gradient g·W; a convolution's, the transposed convolution of g). That use adds
its own outer product to the example's weight gradient, with the roles of the two factors
swapped (the incoming gradient g plays G, the output gradient of g·W plays A), and is stacked
along T with the forward uses like any other call. Parameter gradients of such a module then
come only from the engine (autograd is never asked for them), so the two-pass strategy, which
asks autograd, refuses it. (The engine replaces those layers' ``forward`` while it records; a
deep copy of the module would keep calling the original layers, so wrap the copy instead.)
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.graph import get_gradient_edge
from torch.nn.utils import parametrize

STRATEGIES = ("bookkeeping", "two_pass")
SUPPORTED = (nn.Linear, nn.Conv2d, nn.ConvTranspose2d, nn.Embedding, nn.GroupNorm, nn.LayerNorm)


def _refusal(name: str, layer: nn.Module) -> str | None:
    """Why the engine cannot handle this layer (None: it can)."""
    label = f"layer {name or '<root>'!r} ({type(layer).__name__})"
    if parametrize.is_parametrized(layer) or hasattr(layer, "weight_orig"):
        return (f"{label} is spectral-norm (or otherwise) parametrized: its weight is not a parameter, so "
                "ghost norms do not apply; use grad_sample_mode 'ew' or 'hooks'")
    if not isinstance(layer, SUPPORTED):
        return f"{label} owns trainable parameters and has no ghost-norm rule; use grad_sample_mode 'ew' or 'hooks'"
    if isinstance(layer, (nn.Conv2d, nn.ConvTranspose2d)):
        if layer.groups != 1 or layer.padding_mode != "zeros" or isinstance(layer.padding, str):
            return f"{label}: only groups=1 and numeric zero padding are supported"
    return None


class _Record:
    """One call of a layer: its input, and the autograd edge of its output (the output itself is not held, so
    the graph frees it as the backward pass goes). ``transposed``: the input-gradient use of a Linear/Conv2d
    weight (input: the incoming gradient g)."""

    __slots__ = ("layer", "input", "edge", "batch", "grad", "transposed")

    def __init__(self, layer: nn.Module, input: torch.Tensor, output: torch.Tensor, transposed: bool = False):
        self.layer, self.input, self.grad, self.transposed = layer, input, None, transposed
        self.edge, self.batch = get_gradient_edge(output), output.shape[0]


def _output_padding(layer: nn.Conv2d, x_shape, g_shape) -> list[int]:
    """The output padding that makes the transposed convolution of g return x's spatial size."""
    return [x_shape[2 + i] - ((g_shape[2 + i] - 1) * layer.stride[i] - 2 * layer.padding[i]
                              + layer.dilation[i] * (layer.kernel_size[i] - 1) + 1) for i in range(2)]


class _SecondOrder(torch.autograd.Function):
    """A Linear/Conv2d call whose input gradient is an ordinary, differentiable (and recorded) op.

    It returns no weight or bias gradient: under the engine those come from book-keeping only."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer, engine):
        ctx.layer, ctx.engine = layer, engine
        ctx.save_for_backward(x, weight)
        if isinstance(layer, nn.Linear):
            return F.linear(x, weight, bias)
        return layer._conv_forward(x, weight, bias)

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None
        layer = ctx.layer
        if isinstance(layer, nn.Linear):
            gx = g @ weight
        else:
            # the convolution's own input-gradient kernel (differentiable again, and faster than conv_transpose2d)
            gx = torch.ops.aten.convolution_backward(g, x.detach(), weight, None, layer.stride, layer.padding,
                                                     layer.dilation, False, [0, 0], 1, [True, False, False])[0]
        if torch.is_grad_enabled() and ctx.engine._enabled:  # differentiated again: a use of W to record
            ctx.engine._records.append(_Record(layer, g.detach(), gx, transposed=True))
        return gx, None, None, None, None


class GhostClipping(nn.Module):
    """Wraps a module; records each supported layer's input and output during a training forward.

    ``clipped_sums(losses, groups, bounds)`` then returns, per group and parameter, the sum over
    examples of each example's gradient clipped group by group to the group's bound (the factor
    ``min(1, c / (‖g‖ + 1e-6))`` of :class:`~dpsynth.mechanisms.dpsgd.GradientSanitizer`).
    ``losses`` are the per-example losses (batch,) of that forward pass. The sums are new tensors, one per
    parameter, that the caller may modify in place.
    """

    def __init__(self, module: nn.Module, *, strategy: str = "bookkeeping", second_order: bool = False):
        super().__init__()
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy: must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
        if second_order and strategy == "two_pass":
            raise ValueError("ghost clipping: the two-pass strategy cannot differentiate through input "
                             "gradients (a gradient penalty); use 'bookkeeping'")
        self._module = module
        self.strategy = strategy
        self.second_order = second_order
        self._records: list[_Record] = []
        self._enabled = True
        self._owner: dict[int, nn.Module] = {}
        for name, layer in module.named_modules():
            own = [p for p in layer.parameters(recurse=False) if p.requires_grad]
            if parametrize.is_parametrized(layer):  # the trainable tensor lives in layer.parametrizations
                own = [p for p in layer.parametrizations.parameters() if p.requires_grad]
            if not own or isinstance(layer, parametrize.ParametrizationList) or _is_parametrization(name):
                continue
            why = _refusal(name, layer)
            if why:
                raise ValueError(f"ghost clipping: {why}")
            if second_order and isinstance(layer, nn.ConvTranspose2d):
                raise ValueError(f"ghost clipping: layer {name!r} (ConvTranspose2d) has no second-order rule")
            for p in own:
                self._owner[id(p)] = layer
            layer.register_forward_hook(self._hook)
            if second_order and isinstance(layer, (nn.Linear, nn.Conv2d)):
                layer.forward = self._second_order_forward(layer)

    def _second_order_forward(self, layer: nn.Module):
        plain = layer.forward

        def forward(x):
            if self._enabled and torch.is_grad_enabled() and layer.weight.requires_grad:
                return _SecondOrder.apply(x, layer.weight, layer.bias, layer, self)
            return plain(x)
        return forward

    def forward(self, *args, **kwargs):
        return self._module(*args, **kwargs)

    def disable_hooks(self) -> None:
        self._enabled = False

    def enable_hooks(self) -> None:
        self._enabled = True

    def _hook(self, layer: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        if self._enabled and torch.is_grad_enabled() and output.requires_grad \
                and any(p.requires_grad for p in layer.parameters(recurse=False)):
            self._records.append(_Record(layer, inputs[0].detach(), output))

    def clear(self) -> None:
        self._records = []

    # --- the engine ------------------------------------------------------------------------
    def clipped_sums(self, losses: torch.Tensor, groups: Sequence[Sequence[nn.Parameter]],
                     bounds: Sequence[float]) -> list[list[torch.Tensor]]:
        try:
            stray = [tuple(p.shape) for g in groups for p in g if id(p) not in self._owner]
            if stray:
                raise ValueError(f"ghost clipping: parameters of shapes {stray} are not trainable parameters of the wrapped module")
            if self.strategy == "two_pass" and len(groups) != 1:
                raise ValueError("ghost clipping: the two-pass strategy clips one group only; use 'bookkeeping'")
            n = self._output_grads(losses, keep_graph=self.strategy == "two_pass")
            norms, kept = self._norms(n)
            factors = []
            for group, bound in zip(groups, bounds):
                total = torch.stack([norms.get(id(p), losses.new_zeros(n)) for p in group]).sum(0)
                factors.append((bound / (total.sqrt() + 1e-6)).clamp(max=1.0))
            if self.strategy == "two_pass":
                params = list(groups[0])
                grads = torch.autograd.grad((losses * factors[0].detach()).sum(), params, allow_unused=True)
                out, seen = [], set()
                for p, g in zip(params, grads):
                    g = torch.zeros_like(p) if g is None else g.clone() if g.data_ptr() in seen else g
                    seen.add(g.data_ptr())  # autograd may hand two parameters one tensor (x + p1 + p2)
                    out.append(g)
                return [out]
            weighted = self._weighted_grads(factors, groups, kept)
            return [[weighted.get(id(p), torch.zeros_like(p)) for p in group] for group in groups]
        finally:
            self.clear()

    def _output_grads(self, losses: torch.Tensor, *, keep_graph: bool) -> int:
        """One backward pass for the output gradient of every recorded layer call (no weight gradients).

        A call that the losses do not reach contributes nothing and is dropped; in second-order mode, so is one
        whose output gradient is zero."""
        if losses.dim() != 1:
            raise ValueError(f"losses: need one loss per example, shape (batch,), got {tuple(losses.shape)}")
        n = losses.shape[0]
        for r in self._records:
            if r.batch != n:
                raise ValueError(f"losses: {n} per-example losses but a recorded layer saw a batch of {r.batch}")
        if self._records:
            grads = torch.autograd.grad(losses.sum(), [r.edge for r in self._records], allow_unused=True,
                                        retain_graph=keep_graph)
            for r, g in zip(self._records, grads):
                r.grad, r.edge = g, None
            records = [r for r in self._records if r.grad is not None]
            if self.second_order and records:
                # a gradient penalty reaches the forward calls that compute ∇_x D only through the activations'
                # derivatives: exact zeros for piecewise-linear ones (LeakyReLU); such a call adds nothing
                live = torch.stack([r.grad.any() for r in records]).tolist()
                records = [r for r, keep in zip(records, live) if keep]
            self._records = records
        return n

    def _by_layer(self) -> dict[nn.Module, list[_Record]]:
        layers: dict[nn.Module, list[_Record]] = {}
        for r in self._records:
            layers.setdefault(r.layer, []).append(r)
        return layers

    @torch.no_grad()
    def _norms(self, n: int) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
        """``({id(param): (n,)}, {id(param): (n, *param.shape) or (n, d·p)})``: each example's squared gradient
        norm restricted to each parameter, and the per-example gradients that were instantiated and are kept
        for the clipped sum (biases, norm layers' affine parameters, and the weights that
        :func:`keep_instantiated` keeps; a layer whose gradients are all kept releases its records' tensors)."""
        norms: dict[int, torch.Tensor] = {}
        kept: dict[int, torch.Tensor] = {}
        for layer, records in self._by_layer().items():
            weight, bias = getattr(layer, "weight", None), getattr(layer, "bias", None)
            per_example = {}
            if _is_norm(layer):
                gw, gb = zip(*(_norm_layer_grads(layer, r) for r in records))
                per_example = {weight: sum(gw), bias: sum(gb)}
            else:
                forward = [r for r in records if not r.transposed]
                if bias is not None and bias.requires_grad and forward:
                    per_example[bias] = sum(_bias_grad(layer, r) for r in forward)
                if weight is not None and weight.requires_grad:
                    if isinstance(layer, nn.Embedding):
                        norms[id(weight)] = _embedding_sq_norms(layer, records)
                    else:
                        norms[id(weight)], grads = _weight_sq_norms(layer, records, n)
                        if grads is not None:
                            kept[id(weight)] = grads
            for p, g in per_example.items():
                if p is not None and p.requires_grad:
                    norms[id(p)], kept[id(p)] = _sq(g), g
            if all(id(p) in kept for p in (weight, bias) if p is not None and p.requires_grad):
                for r in records:  # everything this layer contributes is in ``kept``
                    r.input = r.grad = None
        return norms, kept

    @torch.no_grad()
    def _weighted_grads(self, factors: list[torch.Tensor], groups, kept: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        """``{id(param): Σ_i c_i ∇ℓ_i}`` for every recorded parameter, c the factors of its group: from the
        kept per-example gradients, else (a weight whose norm was a ghost norm, or an embedding) formed once
        from the stored inputs and the rescaled output gradients by the layer's own weight-gradient kernel."""
        factor_of = {id(p): c for group, c in zip(groups, factors) for p in group}
        out: dict[int, torch.Tensor] = {}
        for layer, records in self._by_layer().items():
            weight = getattr(layer, "weight", None)
            for p in (weight, getattr(layer, "bias", None)):
                if p is None or id(p) not in factor_of:
                    continue
                c = factor_of[id(p)]
                if id(p) in kept:
                    g = kept.pop(id(p))
                    s = torch.mv(g.reshape(g.shape[0], -1).T, c)
                    out[id(p)] = _to_weight(layer, s) if p is weight and not _is_norm(layer) else s.view(p.shape)
                elif p is weight and not _is_norm(layer):
                    for r in records:
                        w = _weight_grad(layer, r, _scale(r.grad, c))
                        out[id(p)] = out[id(p)].add_(w) if id(p) in out else w
        return out


def _is_norm(layer: nn.Module) -> bool:
    return isinstance(layer, (nn.GroupNorm, nn.LayerNorm))


def _is_parametrization(name: str) -> bool:
    return ".parametrizations." in f".{name}."


def _sq(per_example: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(per_example.reshape(per_example.shape[0], -1), dim=1) ** 2


def _scale(t: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return t * c.view(-1, *([1] * (t.dim() - 1)))


# --- per-layer rules ------------------------------------------------------------------------------

CHUNK_ELEMENTS = 1 << 20  # the per-layer work's temporaries per chunk of examples: 4 MiB of float32


def chunk_size(n: int, per_example: int) -> int:
    """Examples per chunk of a layer's norm work (``per_example`` temporary numbers each: patches, Gram
    matrices or gradients): chunks small enough to stay in cache, never a patch copy of the whole batch."""
    return max(1, min(n, CHUNK_ELEMENTS // per_example))


def use_ghost_norm(T: int, p: int, d: int) -> bool:
    """The cost model of mixed ghost clipping: ghost norm ~T²(p + d) against instantiation ~T·p·d."""
    return T * (p + d) < p * d


def keep_instantiated(n: int, p: int, d: int, stored: int) -> bool:
    """Book-keeping's choice: instantiate a weight's per-example gradients (n·d·p numbers) and keep them for the
    clipped sum when they take no more memory than the layer inputs and output gradients (``stored`` numbers)
    that they replace. Kept, they cost what the layer's weight gradient costs anyway (which the clipped sum
    then skips), so they are preferred to a ghost norm whatever :func:`use_ghost_norm` says."""
    return n * p * d <= stored


def _patches(x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
    """(n, T, kh·kw·C): the convolution's input patches of ``x`` (n, C, H, W), one row per output position,
    entries ordered (kh, kw, c). Built by one copy from a channels-last padded view: runs of kw·C contiguous
    numbers, not F.unfold's per-example gather."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = layer.kernel_size, layer.stride, layer.padding, layer.dilation
    xp = F.pad(x.permute(0, 2, 3, 1), (0, 0, pw, pw, ph, ph))
    n, H, W, C = xp.shape
    Ho, Wo = (H - dh * (kh - 1) - 1) // sh + 1, (W - dw * (kw - 1) - 1) // sw + 1
    s0, s1, s2, s3 = xp.stride()
    view = xp.as_strided((n, Ho, Wo, kh, kw, C), (s0, s1 * sh, s2 * sw, s1 * dh, s2 * dw, s3))
    return view.reshape(n, Ho * Wo, kh * kw * C)


def _dims(layer: nn.Module, r: _Record) -> tuple[int, int, int]:
    """(T, p, d) of one call: positions, input and output sizes of the per-example gradient d × p."""
    if isinstance(layer, nn.Linear):
        p, d = layer.in_features, layer.out_features
        return r.input[0].numel() // (d if r.transposed else p), p, d
    kh, kw = layer.kernel_size
    if isinstance(layer, nn.Conv2d):
        out = r.input if r.transposed else r.grad
        return out.shape[2] * out.shape[3], layer.in_channels * kh * kw, layer.out_channels
    return r.input.shape[2] * r.input.shape[3], layer.out_channels * kh * kw, layer.in_channels  # ConvTranspose2d


def _rows(layer: nn.Module, r: _Record, s: slice) -> tuple[torch.Tensor, torch.Tensor]:
    """(A (m, T, p), G (m, T, d)) for the examples ``s`` of one call: the per-example weight gradient is
    Gᵀ A (d × p, entries in :func:`_to_weight`'s order)."""
    x, g = r.input[s], r.grad[s]
    if r.transposed:  # g·W (or its convolution): the output gradient plays the input, the incoming gradient G
        x, g = g, x
    m = x.shape[0]
    if isinstance(layer, nn.Linear):
        return x.reshape(m, -1, x.shape[-1]), g.reshape(m, -1, g.shape[-1])
    if isinstance(layer, nn.Conv2d):
        return _patches(x, layer), g.flatten(2).transpose(1, 2)
    if isinstance(layer, nn.ConvTranspose2d):  # the transpose: input positions × patches of the output gradient
        return _patches(g, layer), x.flatten(2).transpose(1, 2)
    raise TypeError(type(layer).__name__)


def _to_weight(layer: nn.Module, flat: torch.Tensor) -> torch.Tensor:
    """A d × p gradient (or d·p numbers) in the layer weight's own shape."""
    weight = layer.weight
    if isinstance(layer, (nn.Conv2d, nn.ConvTranspose2d)):  # (d, kh, kw, c) -> (d, c, kh, kw)
        d, c, kh, kw = weight.shape
        return flat.reshape(d, kh, kw, c).permute(0, 3, 1, 2).contiguous()
    return flat.reshape(weight.shape)


def _weight_sq_norms(layer: nn.Module, records: list[_Record], n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each example's squared weight-gradient norm (all calls of the layer stacked along T), and the per-example
    gradients (n, d·p) when :func:`keep_instantiated` keeps them; else None. Computed in chunks of examples."""
    dims = [_dims(layer, r) for r in records]
    T, p, d = sum(t for t, _, _ in dims), dims[0][1], dims[0][2]
    stored = sum(r.input.numel() + r.grad.numel() for r in records)
    keep = keep_instantiated(n, p, d, stored)
    ghost = not keep and use_ghost_norm(T, p, d)
    per_example = T * (p + d) + (2 * T * T if ghost else d * p)
    m = chunk_size(n, per_example)
    norms = records[0].grad.new_empty(n)
    grads = records[0].grad.new_empty(n, d, p) if keep else None
    for start in range(0, n, m):
        s = slice(start, start + m)
        parts = [_rows(layer, r, s) for r in records]
        a = parts[0][0] if len(parts) == 1 else torch.cat([a for a, _ in parts], dim=1)
        g = parts[0][1] if len(parts) == 1 else torch.cat([g for _, g in parts], dim=1)
        if ghost:  # ⟨A Aᵀ, G Gᵀ⟩ over the T × T Gram matrices
            norms[s] = (torch.bmm(a, a.transpose(1, 2)) * torch.bmm(g, g.transpose(1, 2))).sum((1, 2))
            continue
        block = torch.bmm(g.transpose(1, 2), a, out=grads[s]) if keep else torch.bmm(g.transpose(1, 2), a)
        norms[s] = _sq(block)
    return norms, None if grads is None else grads.view(n, -1)


def _embedding_sq_norms(layer: nn.Embedding, records: list[_Record]) -> torch.Tensor:
    """Rows looked up twice by one example add up: ‖∇E‖² = Σ_{t,s} [idx_t = idx_s] g_t·g_s."""
    idx = torch.cat([r.input.reshape(r.input.shape[0], -1) for r in records], dim=1)
    g = torch.cat([_embedding_grad_rows(layer, r) for r in records], dim=1)
    same = (idx[:, :, None] == idx[:, None, :]).to(g.dtype)
    return (same * torch.bmm(g, g.transpose(1, 2))).sum((1, 2))


def _embedding_grad_rows(layer: nn.Embedding, r: _Record) -> torch.Tensor:
    """(n, T, d): the output gradient of each looked-up row (zero where the index is padding_idx)."""
    n = r.input.shape[0]
    g = r.grad.reshape(n, -1, layer.embedding_dim)
    if layer.padding_idx is not None:
        g = g * (r.input.reshape(n, -1, 1) != layer.padding_idx)
    return g


def _bias_grad(layer: nn.Module, r: _Record) -> torch.Tensor:
    """(n, d): each example's bias gradient."""
    g = r.grad
    if isinstance(layer, (nn.Conv2d, nn.ConvTranspose2d)):
        return g.sum((2, 3))
    return g.reshape(g.shape[0], -1, g.shape[-1]).sum(1)  # Linear


def _weight_grad(layer: nn.Module, r: _Record, g: torch.Tensor) -> torch.Tensor:
    """Σ_i of the weight gradients for output gradients ``g`` (already scaled per example)."""
    x = r.input
    if r.transposed:  # weight gradient of g·W, or of the transposed convolution of g; here x is g, g the output's
        if isinstance(layer, nn.Linear):
            return x.reshape(-1, x.shape[-1]).T @ g.reshape(-1, g.shape[-1])
        return torch.ops.aten.convolution_backward(
            g, x, layer.weight, None, layer.stride, layer.padding, layer.dilation, True,
            _output_padding(layer, g.shape, x.shape), 1, [False, True, False])[1]
    if isinstance(layer, nn.Linear):
        return g.reshape(-1, g.shape[-1]).T @ x.reshape(-1, x.shape[-1])
    if isinstance(layer, nn.Embedding):
        gg = g.reshape(-1, layer.embedding_dim)
        if layer.padding_idx is not None:
            gg = gg * (x.reshape(-1, 1) != layer.padding_idx)
        return torch.zeros_like(layer.weight).index_add_(0, x.reshape(-1), gg)
    transposed = isinstance(layer, nn.ConvTranspose2d)
    return torch.ops.aten.convolution_backward(
        g, x, layer.weight, None, layer.stride, layer.padding, layer.dilation, transposed,
        layer.output_padding if transposed else [0, 0], layer.groups, [False, True, False])[1]


def _norm_layer_grads(layer: nn.Module, r: _Record) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, *weight.shape) per-example gradients of a GroupNorm/LayerNorm's affine weight and bias."""
    x, g = r.input, r.grad
    n = x.shape[0]
    if isinstance(layer, nn.GroupNorm):
        xhat = F.group_norm(x, layer.num_groups, eps=layer.eps)
        dims = tuple(range(2, x.dim()))
        return (g * xhat).sum(dims), g.sum(dims)
    shape = layer.normalized_shape
    xhat = F.layer_norm(x, shape, eps=layer.eps)
    lead = x.dim() - len(shape)
    dims = tuple(range(1, lead))
    gw, gb = g * xhat, g
    if dims:
        gw, gb = gw.sum(dims), gb.sum(dims)
    return gw.reshape(n, *shape), gb.reshape(n, *shape)

