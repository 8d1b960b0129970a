"""
A Hugging Face config.json checked as it is read: every field the loader uses must have the type and
range this project's GPT implements, else one line naming the file, the key, the value and what is
allowed. A value that passed unchecked would reach the model as a traceback (a layer count written
as a string), or worse, as a different model (the string "false" is truthy: a tied head).

    read_object(file)             -> the JSON object in file (one-line errors, deep nesting included)
    hf_config_args(config, path)  -> GPTConfig arguments (model.py), or UserError
    config_dtype(config, path)    -> the float dtype the weights are stored in
"""
import math

import torch

from configurator import UserError
from fileio import read_json

# transformers' dtype names a directory may store weights in; an integer dtype means quantized weights,
# which this GPT would read as plain numbers (truncated, unscaled)
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")


def read_object(file, what="JSON object"):
    """The JSON object in `file` (fileio.read_json), refused in one line naming the file: unreadable,
    not JSON (not UTF-8, or nested so deep that Python's parser recurses out), or not an object."""
    try:
        obj = read_json(file)
    except OSError as e:
        raise UserError(f"{file} cannot be read as JSON ({type(e).__name__}: {str(e)[:120]})") from None
    except ValueError as e:
        raise UserError(f"{file} is {str(e)[:140]}: the file is damaged") from None
    if not isinstance(obj, dict):
        raise UserError(f"{file} is not a {what} (a JSON object); found a JSON {type(obj).__name__}")
    return obj


def shown(value):
    """A value as an error line shows it: repr, one line, at most 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Fields:
    """Typed reads of one config.json: get_int / get_float / get_bool / get_str refuse a value of another
    type or out of range, naming the key. JSON's true is not an integer here (Python's bool is an int)."""

    def __init__(self, config, file):
        self.config, self.file = config, file

    def refuse(self, key, allowed):
        raise UserError(f"{self.file}: {key} = {shown(self.config.get(key))} is not allowed: {allowed}; "
                        f"correct config.json or download the model again")

    def need(self, key, kind):
        if key not in self.config:
            raise UserError(f"{self.file} lacks {key!r}, which a {kind} model needs")
        return self.config[key]

    def get_int(self, key, kind, default=..., minimum=1):
        """A JSON integer >= minimum. default=...: required; a default given: used when absent or null."""
        v = self.need(key, kind) if default is ... else self.config.get(key)
        if v is None and default is not ...:
            return default
        if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
            self.refuse(key, f"an integer >= {minimum}" + (" or null" if default is not ... else ""))
        return v

    def get_float(self, key, default):
        """A finite number > 0 (an integer is a number), default when absent."""
        v = self.config.get(key, default)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
            self.refuse(key, "a finite number > 0")
        return float(v)

    def get_bool(self, key, default):
        """JSON true or false, default when absent: the string "false" is refused, never read as truthy."""
        v = self.config.get(key, default)
        if not isinstance(v, bool):
            self.refuse(key, "true or false")
        return v

    def get_str(self, key, default, choices):
        v = self.config.get(key, default)
        if not isinstance(v, str) or v not in choices:
            self.refuse(key, f"one of {', '.join(map(repr, choices))} (others are not implemented here)")
        return v


def not_implemented(file, what):
    raise UserError(f"{file}: {what} is not implemented here; the model would compute something else")


def hf_config_args(config, path):
    """GPTConfig arguments for a config.json (a dict); anything this GPT would compute differently, or a
    value of the wrong type or range, is a UserError naming the key."""
    file = f"{path}/config.json"
    c = Fields(config, file)
    kind = config.get("model_type")
    if not isinstance(kind, str) or kind not in ("gpt2", "qwen2", "llama"):
        raise UserError(f"{file}: model_type {shown(config.get('model_type'))} is not supported (gpt2, qwen2, llama)")
    if config.get("quantization_config") is not None:
        not_implemented(file, "quantization_config (quantized weights)")
    config_dtype(config, path)  # an integer dtype is refused now, before any weight is read
    if kind == "gpt2":
        gelu = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none"}[c.get_str(
            "activation_function", "gelu_new", ("gelu_new", "gelu_pytorch_tanh", "gelu"))]
        if c.get_bool("scale_attn_by_inverse_layer_idx", False) or c.get_bool("reorder_and_upcast_attn", False) \
                or not c.get_bool("scale_attn_weights", True):
            not_implemented(file, "GPT-2's attention scaling options")
        if not c.get_bool("tie_word_embeddings", True):
            not_implemented(file, "an untied GPT-2 head (tie_word_embeddings false)")
        if c.get_bool("add_cross_attention", False):
            not_implemented(file, "cross-attention (add_cross_attention)")
        C, H = c.get_int("n_embd", kind), c.get_int("n_head", kind)
        if C % H:
            c.refuse("n_head", f"a divisor of n_embd ({C})")
        return dict(arch="gpt2", block_size=c.get_int("n_positions", kind), vocab_size=c.get_int("vocab_size", kind),
                    n_layer=c.get_int("n_layer", kind), n_head=H, n_embd=C, n_inner=c.get_int("n_inner", kind, 0),
                    bias=True, gelu=gelu, norm_eps=c.get_float("layer_norm_epsilon", 1e-5), tie_head=True)
    # qwen2, llama: transformers 5 keeps RoPE's settings in rope_parameters, 4 in rope_scaling + rope_theta
    rope = {}
    for key in ("rope_parameters", "rope_scaling"):
        if config.get(key) is not None and not isinstance(config[key], dict):
            c.refuse(key, "a JSON object or null")
        rope = rope or config.get(key) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        not_implemented(file, f"rope scaling {shown(rope_type)}")
    theta = c.get_float("rope_theta", 10000.0)  # checked even where rope_parameters holds the one used
    if "rope_theta" in rope:
        inner = Fields(rope, f"{file} rope_parameters").get_float("rope_theta", None)
        if "rope_theta" in config and inner != theta:  # transformers 4 reads the outer one, 5 the inner one
            c.refuse("rope_theta", f"the rope_parameters' rope_theta ({inner}) or absent: two thetas are ambiguous")
        theta = inner
    c.get_str("hidden_act", "silu", ("silu",))
    if c.get_bool("use_sliding_window", False):
        not_implemented(file, "sliding-window attention")
    layer_types = config.get("layer_types")
    if layer_types is not None and (not isinstance(layer_types, list) or set(layer_types) - {"full_attention"}):
        c.refuse("layer_types", "null or a list of 'full_attention' (sliding-window attention is not implemented)")
    if c.get_bool("attention_bias", False) or c.get_bool("mlp_bias", False):
        not_implemented(file, "attention_bias / mlp_bias")
    C, H = c.get_int("hidden_size", kind), c.get_int("num_attention_heads", kind)
    if C % H or (C // H) % 2:  # RoPE rotates pairs: half a head against the other half
        c.refuse("num_attention_heads", f"a divisor of hidden_size ({C}) leaving an even head size")
    if config.get("head_dim") is not None and c.get_int("head_dim", kind, None) != C // H:
        c.refuse("head_dim", f"null or hidden_size / num_attention_heads = {C // H} (other head sizes are not "
                             f"implemented here)")
    kv = c.get_int("num_key_value_heads", kind, H)
    if H % kv:
        c.refuse("num_key_value_heads", f"a divisor of num_attention_heads ({H})")
    return dict(arch="llama", block_size=c.get_int("max_position_embeddings", kind),
                vocab_size=c.get_int("vocab_size", kind), n_layer=c.get_int("num_hidden_layers", kind), n_head=H,
                n_embd=C, n_kv_head=kv, n_inner=c.get_int("intermediate_size", kind),
                norm_eps=c.get_float("rms_norm_eps", 1e-6), qkv_bias=kind == "qwen2", rope_theta=theta,
                tie_head=c.get_bool("tie_word_embeddings", False))


def config_dtype(config, path):
    """The dtype config.json says the weights are stored in (dtype, or transformers 4's torch_dtype), float32
    if unsaid; an integer or unknown dtype is refused, never cast or truncated."""
    names = [config.get(key) for key in ("dtype", "torch_dtype")]
    for key, name in zip(("dtype", "torch_dtype"), names):  # both checked: transformers 4 reads the second
        if name is not None and (not isinstance(name, str) or name not in FLOAT_DTYPES):
            Fields(config, f"{path}/config.json").refuse(key, f"null or one of {', '.join(FLOAT_DTYPES)} "
                                                              f"(integer dtypes mean quantized weights)")
    return getattr(torch, next((n for n in names if n is not None), "float32"))
