"""Key prefixes of wrapped models: a checkpoint saved from ``DistributedDataParallel(model)``
or ``torch.compile(model)`` has ``module.`` or ``_orig_mod.`` before every key, and a port that
holds the model as a submodule expects one. Each key would get a line of its own naming a near
miss; one line says what happened and the dict comprehension that fixes it.
"""

# Prefixes a wrapper adds to every key, with whose they are.
WRAPPERS = {"module.": "a DistributedDataParallel or DataParallel wrapper's",
            "_orig_mod.": "torch.compile's wrapper's", "module._orig_mod.": "DDP's and torch.compile's wrappers'"}


def strip_advice(prefix):
    """How to strip ``prefix`` from a state dict, for a refusal's line."""
    return f"strip it, {{k.removeprefix({prefix!r}): v for k, v in state_dict.items()}}"


def _commonest_prefix(keys, others):
    """The dotted prefix p that most often makes a key of ``keys`` p + a key of ``others``, or None."""
    counts = {}
    for key in keys:
        if not isinstance(key, str):  # a pickle's int key has no dotted prefix
            continue
        for i, char in enumerate(key):
            if char == "." and key[i + 1:] in others:
                counts[key[: i + 1]] = counts.get(key[: i + 1], 0) + 1
    return max(counts, key=counts.get, default=None)


def prefix_hint(missing, unexpected):
    """([lines], the keys they explain) where the unexpected keys are missing keys with one
    prefix before them (a checkpoint saved from a wrapped model), or the other way round (a
    port holding the model as a submodule); ([], set()) otherwise. Two keys at least: one
    key's own line ("did you mean") says it as well."""
    missing_set, unexpected_set = set(missing), set(unexpected)
    for with_it, without in ((unexpected, missing_set), (missing, unexpected_set)):
        prefix = _commonest_prefix(with_it, without)
        if prefix is None:
            continue
        explained = [k for k in with_it if isinstance(k, str) and k.startswith(prefix) and k[len(prefix):] in without]
        if len(explained) < 2:
            continue
        said = set(explained) | {k[len(prefix):] for k in explained}
        if with_it is unexpected:
            whose = f" ({WRAPPERS[prefix]})" if prefix in WRAPPERS else ""
            line = (f"  {len(explained)} keys of the state dict are the model's keys with {prefix!r} before them"
                    f"{whose}, e.g. {explained[0]!r}: {strip_advice(prefix)}")
        else:
            line = (f"  {len(explained)} keys of the model are the state dict's keys with {prefix!r} before them, "
                    f"e.g. {explained[0]!r}: add it, {{{prefix!r} + k: v for k, v in state_dict.items()}}, or "
                    f"convert into the model's {prefix.rstrip('.')!r} submodule")
        return [line], said
    return [], set()
