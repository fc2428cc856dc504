"""Record what every collective of a per-device function did, while the program runs.

`record_collectives(fn, axis_names)` returns a `Recording`: call it inside a `shard_map` body where
you would call `fn`, and it returns `(fn's outputs, records)`. It traces `fn` to a jaxpr and
evaluates that jaxpr equation by equation in the enclosing trace (the pattern of JAX's "Writing
custom Jaxpr interpreters"), so the program computes exactly what `fn` computes; at each collective
it also keeps a bounded preview of the input and output (stages/record/previews.py), which leave the
program as extra outputs: a few KiB per device and collective call, whatever the array sizes. The
user's source and `jax.lax` are left alone.

- Calls inside `jit`, `custom_jvp`/`custom_vjp` and `checkpoint` are evaluated inline and
  recorded; `scan`, `fori_loop` and `while_loop` carry the previews and a counter, so a card says
  how often the call ran and shows its first and last iteration; `cond`/`switch` carry them
  through every branch, so a call in a branch is recorded when (and as often as) its branch runs.
- `lax.pmean` is a psum then a division; it is shown as one pmean call whose output is the mean
  (told by JAX's own frames in the equation's traceback; without them it shows as a psum).
- A collective the recorder cannot show (an unknown primitive, one inside a while loop's
  condition or inside a primitive it does not enter, such as a nested shard_map) still runs
  unchanged; its card says `recorded: false` and why.

The static facts of each call (`Site`, stages/record/sites.py) are collected at trace time into
`Recording.sites`. The host turns the sites and the records into the view's cards with
`collective_cards` / `collectives_state` (stages/record/cards.py).
"""
from __future__ import annotations

from typing import Callable, Sequence

from .previews import empty_record, value_preview, varying_over
from .sites import INLINE_CALLS, MAX_CARDS, PSUMS, Planner, Site, open_jaxpr


class _Interpreter:
    """Evaluates a planned jaxpr in the current trace; `state` maps record slots to records."""

    def __init__(self, planner: Planner, axis_names: tuple[str, ...]):
        self.actions = planner.actions
        self.axis_names = axis_names

    def run(self, jaxpr, consts, args, state: dict, path: tuple):
        from jax.extend.core import Literal

        env: dict = {}

        def read(v):
            return v.val if isinstance(v, Literal) else env[v]

        env.update(zip(jaxpr.constvars, consts))
        env.update(zip(jaxpr.invars, args))
        for i, eqn in enumerate(jaxpr.eqns):
            key = path + (i,)
            invals = [read(v) for v in eqn.invars]
            action = self.actions.get(key)
            if action is None:
                outvals = _bind(eqn, invals)
            else:
                outvals, state = getattr(self, "_" + action.kind)(eqn, invals, state, key, action)
            env.update(zip(eqn.outvars, outvals))
        return [read(v) for v in jaxpr.outvars], state

    # collectives

    def _record(self, state, site: Site, part: str, value, shape, dtype, first):
        import jax
        import jax.numpy as jnp

        preview = varying_over(value_preview(value, shape, dtype), self.axis_names)
        record = {**state[site.slot]}
        record["first"] = {**record["first"]}
        if site.in_loop:
            record["last"] = {**record["last"], part: preview}
            preview = jax.tree.map(lambda new, old: jnp.where(first, new, old), preview, record["first"][part])
        record["first"][part] = preview
        return {**state, site.slot: record}

    def _collective(self, eqn, invals, state, key, action):
        import jax

        outvals = _bind(eqn, invals)
        with jax.named_scope("collective_record"):
            for k, site in action.sites:
                count = state[site.slot]["count"]
                if site.recorded:
                    if site.in_shape is not None:
                        state = self._record(state, site, "in", invals[k], site.in_shape, site.in_dtype, count == 0)
                    if site.op != "pmean" or site.primitive not in PSUMS:
                        state = self._record(state, site, "out", outvals[k], site.out_shape, site.out_dtype,
                                             count == 0)
                state = {**state, site.slot: {**state[site.slot], "count": count + 1}}
        return outvals, state

    def _pmean_out(self, eqn, invals, state, key, action):
        import jax

        outvals = _bind(eqn, invals)
        (_, site), = action.sites
        with jax.named_scope("collective_record"):
            count = state[site.slot]["count"]  # already counted by the psum
            state = self._record(state, site, "out", outvals[0], site.out_shape, site.out_dtype, count == 1)
        return outvals, state

    # control flow and calls

    def _inline(self, eqn, invals, state, key, action):
        jaxpr, consts = open_jaxpr(eqn.params[INLINE_CALLS[eqn.primitive.name]])
        with _user_context(eqn):
            return self.run(jaxpr, consts, invals, state, key)

    def _scan(self, eqn, invals, state, key, action):
        from jax import lax

        p = eqn.params
        jaxpr, consts = open_jaxpr(p["jaxpr"])
        n_consts, n_carry = p["num_consts"], p["num_carry"]
        fixed, init, xs = invals[:n_consts], invals[n_consts:n_consts + n_carry], invals[n_consts + n_carry:]

        def body(carry, x):
            values, records = carry
            outs, records = self.run(jaxpr, consts, [*fixed, *values, *x], records, key + ("body",))
            return (outs[:n_carry], records), outs[n_carry:]

        carried = {s: state[s] for s in action.slots}
        with _user_context(eqn):
            (values, records), ys = lax.scan(body, (list(init), carried), list(xs), length=p["length"],
                                             reverse=p["reverse"], unroll=p["unroll"])
        return [*values, *ys], {**state, **records}

    def _while(self, eqn, invals, state, key, action):
        from jax import lax

        p = eqn.params
        cond_jaxpr, cond_consts = open_jaxpr(p["cond_jaxpr"])
        body_jaxpr, body_consts = open_jaxpr(p["body_jaxpr"])
        n_cond, n_body = p["cond_nconsts"], p["body_nconsts"]
        cond_fixed, body_fixed, init = invals[:n_cond], invals[n_cond:n_cond + n_body], invals[n_cond + n_body:]

        def cond(carry):
            (pred,), _ = self.run(cond_jaxpr, cond_consts, [*cond_fixed, *carry[0]], {}, key + ("cond",))
            return pred

        def body(carry):
            values, records = carry
            return self.run(body_jaxpr, body_consts, [*body_fixed, *values], records, key + ("body",))

        carried = {s: state[s] for s in action.slots}
        with _user_context(eqn):
            values, records = lax.while_loop(cond, body, (list(init), carried))
        return list(values), {**state, **records}

    def _cond(self, eqn, invals, state, key, action):
        from jax import lax

        index, operands = invals[0], invals[1:]

        def branch(n, closed):
            jaxpr, consts = open_jaxpr(closed)
            return lambda values, records: self.run(jaxpr, consts, values, records, key + (n,))

        carried = {s: state[s] for s in action.slots}
        branches = [branch(n, b) for n, b in enumerate(eqn.params["branches"])]
        with _user_context(eqn):
            values, records = lax.switch(index, branches, list(operands), carried)
        return list(values), {**state, **records}


def _user_context(eqn):
    """Make what we bind carry the equation's own source line and name scope (so the compiled
    program's collectives still point at the user's line)."""
    from jax.extend import source_info_util as siu

    name_stack = siu.current_name_stack() + eqn.source_info.name_stack
    return siu.user_context(eqn.source_info.traceback, name_stack=name_stack)


def _bind(eqn, invals):
    """What jax.core.eval_jaxpr does for one equation, in the current trace."""
    params = eqn.primitive.get_bind_params(eqn.params)  # JAX 0.10: sub-functions are in the params
    with _user_context(eqn), eqn.ctx.manager:
        out = eqn.primitive.bind(*invals, **params)
    return out if eqn.primitive.multiple_results else [out]


# --- the recording function ------------------------------------------------------------------------

class Recording:
    """`fn` that also returns the records of its collective calls: `(out, records) = rec(*args)`.

    Call it inside a `shard_map` body (or anywhere the mesh axes in `axis_names` are bound).
    Arguments that are not traced (Python numbers, NumPy arrays, objects) reach `fn` unchanged, and
    outputs that are not traced come back as the very objects `fn` returned, so callers that tell
    traced outputs from static ones (cell/programs.py: capture_outputs) see what they would without recording.
    `records` is a list (empty when nothing is recorded) of small dicts of arrays, one per record
    slot; `sites` are the calls' static facts from the latest trace.
    """

    def __init__(self, fn: Callable, axis_names: Sequence[str], max_cards: int = MAX_CARDS,
                 label_output: Callable | None = None, label_input: Callable | None = None):
        self.fn = fn
        self.axis_names = tuple(axis_names)
        self.max_cards = max_cards
        self.sites: list[Site] = []
        # key path -> the name a card gives a value (`grads['w1']`): of fn's outputs, of its arguments
        self.label_output = label_output
        self.label_input = label_input

    def __call__(self, *args):
        import jax

        leaves, tree = jax.tree.flatten(args)
        traced = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.core.Tracer)]
        returned: dict = {}

        def traced_fn(*values):
            full = list(leaves)
            for i, value in zip(traced, values):
                full[i] = value
            out = self.fn(*jax.tree.unflatten(tree, full))
            with_paths, out_tree = jax.tree_util.tree_flatten_with_path(out)
            out_leaves = [leaf for _, leaf in with_paths]
            keep = [i for i, leaf in enumerate(out_leaves) if isinstance(leaf, jax.core.Tracer)]
            returned.update(leaves=out_leaves, tree=out_tree, keep=keep, paths=[with_paths[i][0] for i in keep])
            return [out_leaves[i] for i in keep]

        closed = jax.make_jaxpr(traced_fn)(*[leaves[i] for i in traced])
        planner = Planner(self.max_cards)
        planner.walk(closed.jaxpr, (), (), None)
        self.sites = planner.sites
        in_paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(args)[0]]
        _name_values(closed.jaxpr, planner.sites, self._labels(self.label_output, returned["paths"]),
                     self._labels(self.label_input, [in_paths[i] for i in traced]))
        by_slot = {s.slot: s for s in planner.sites if s.slot is not None}
        state = {slot: varying_over(empty_record(site), self.axis_names) for slot, site in by_slot.items()}
        outs, state = _Interpreter(planner, self.axis_names).run(
            closed.jaxpr, closed.consts, [leaves[i] for i in traced], state, ())
        out_leaves = list(returned["leaves"])
        for i, value in zip(returned["keep"], outs):
            out_leaves[i] = value
        records = [state[slot] for slot in range(planner.slots)]
        return jax.tree.unflatten(returned["tree"], out_leaves), records


    @staticmethod
    def _labels(label, paths) -> list:
        return [label(path) for path in paths] if label is not None else [None] * len(paths)


#: Primitives that pass a value on unchanged in meaning (a dtype, a shape, a scale): a collective's
#: result that reaches a named output only through these is that output.
_PASS_ON = {"convert_element_type", "reshape", "squeeze", "expand_dims", "broadcast_in_dim", "copy", "copy_p",
            "mul", "div", "neg"}


def _name_values(jaxpr, sites, output_labels, input_labels) -> None:
    """Name each top-level collective call by the value it moves: the named output its result
    becomes (`grads['w1']` for `grads = lax.pmean(grads, 'i')`), else the input it reduces."""
    outputs = {id(v): label for v, label in zip(jaxpr.outvars, output_labels) if label}
    inputs = {id(v): label for v, label in zip(jaxpr.invars, input_labels) if label}
    users: dict[int, list] = {}
    for eqn in jaxpr.eqns:
        for v in eqn.invars:
            users.setdefault(id(v), []).append(eqn)
    for site in sites:
        operand, result = site.variables
        var = result
        for _ in range(6):  # a few pass-on steps at most: beyond that it is a new value
            if var is None or id(var) in outputs:
                break
            consumers = users.get(id(var), [])
            if len(consumers) != 1 or consumers[0].primitive.name not in _PASS_ON:
                var = None
                break
            var = consumers[0].outvars[0]
        if var is not None and id(var) in outputs:
            site.value = outputs[id(var)]
        elif operand is not None and id(operand) in inputs:
            site.value = inputs[id(operand)]


def record_collectives(fn: Callable, axis_names: Sequence[str], max_cards: int = MAX_CARDS, *,
                       label_output: Callable | None = None, label_input: Callable | None = None) -> Recording:
    """`fn` (a per-device function) made to also return bounded records of its collective calls.
    `label_output` / `label_input` name fn's output and argument leaves by key path, for the cards."""
    return Recording(fn, axis_names, max_cards, label_output, label_input)

