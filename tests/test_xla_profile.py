"""tools.xla_profile reads a GPU's trace as it reads a CPU's: the GPU parts checked without one.

A GPU is lent rarely and for minutes (docs/benchmarks.md, "GPU"), so what the profile does
with a GPU's program and trace is checked here on stand-ins: an optimised HLO text of the
shape XLA:GPU writes (library calls as custom calls, GEMMs as Triton fusions), and trace
planes as ``jax.profiler.ProfileData`` gives them (planes of lines of events with stats).
The CPU path runs end to end in test_benchmarks' neighbours; here only its fallback.
"""

from types import SimpleNamespace

import jax
import pytest

from tools import ablations, xla_profile

GPU_HLO = """\
HloModule jit_train_step, entry_computation_layout={(bf16[8192,1024]{1,0})->bf16[8192,1024]{1,0}}

%gemm_fusion_dot.7_computation (parameter_0: bf16[8192,1024], parameter_1: bf16[1024,1024]) -> bf16[8192,1024] {
  %parameter_0 = bf16[8192,1024]{1,0} parameter(0)
  %parameter_1 = bf16[1024,1024]{1,0} parameter(1)
  ROOT %dot.3 = bf16[8192,1024]{1,0} dot(%parameter_0, %parameter_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_add (param_0: f32[8192,1024], param_1: f32[8192,1024]) -> f32[8192,1024] {
  %param_0 = f32[8192,1024]{1,0} parameter(0)
  %param_1 = f32[8192,1024]{1,0} parameter(1)
  ROOT %add.1 = f32[8192,1024]{1,0} add(%param_0, %param_1)
}

ENTRY %main.9 (Arg_0.1: bf16[8192,1024], Arg_1.2: bf16[1024,1024], Arg_2.3: f32[8192,1024]) -> bf16[8192,1024] {
  %Arg_0.1 = bf16[8192,1024]{1,0} parameter(0)
  %Arg_1.2 = bf16[1024,1024]{1,0} parameter(1)
  %Arg_2.3 = f32[8192,1024]{1,0} parameter(2)
  %gemm_fusion_dot.7 = bf16[8192,1024]{1,0} fusion(%Arg_0.1, %Arg_1.2), kind=kCustom, calls=%gemm_fusion_dot.7_computation, metadata={op_name="jit(train_step)/jvp(Transformer)/dot_general"}
  %custom-call.12 = (bf16[16,512,16,64]{3,1,2,0}, u8[0]{0}) custom-call(%Arg_0.1, %Arg_0.1, %Arg_0.1), custom_call_target="__cudnn$fmhaSoftmax", metadata={op_name="jit(train_step)/jvp(Transformer)/dot_product_attention"}
  %cublas-gemm.4 = (bf16[8192,1024]{1,0}, s8[4194304]{0}) custom-call(%Arg_0.1, %Arg_1.2), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(train_step)/transpose(jvp(Transformer))/dot_general"}
  %loop_add_fusion = f32[8192,1024]{1,0} fusion(%Arg_2.3, %Arg_2.3), kind=kLoop, calls=%fused_add, metadata={op_name="jit(train_step)/add"}
  ROOT %copy.1 = bf16[8192,1024]{1,0} copy(%gemm_fusion_dot.7)
}
"""


def test_a_gpu_programs_library_calls_and_gemm_fusions_are_put_in_their_categories():
    hlo = xla_profile.parse_hlo(GPU_HLO)

    def category_of(name):
        opcode, _, inner, u32, _, targets = hlo[name]
        return xla_profile.category(opcode, inner, u32, name, targets)

    assert category_of("custom-call.12") == "attention"  # cuDNN's flash attention
    assert category_of("cublas-gemm.4") == "matmul"  # cuBLASLt
    assert category_of("gemm_fusion_dot.7") == "matmul"  # a Triton GEMM: a fusion around a dot
    assert category_of("loop_add_fusion") == "elementwise"
    assert category_of("copy.1") == "copy/layout"
    assert xla_profile.phase(hlo["cublas-gemm.4"][4]) == "backward"


def _event(op, ns, module="jit_train_step"):
    return SimpleNamespace(stats=[("hlo_op", op), ("hlo_module", module)], duration_ns=ns)


def _plane(name, **lines):
    return SimpleNamespace(name=name, lines=[SimpleNamespace(name=k.replace("_", " "), events=v)
                                             for k, v in lines.items()])


def test_a_gpus_kernels_count_once_and_its_host_launches_not_at_all():
    planes = [
        # The host's events for the same instructions: launches, not the work.
        _plane("/host:CPU", XLA_thunks=[_event("gemm_fusion_dot.7", 5), _event("custom-call.12", 7)]),
        # A kernel per instruction on the stream, two for the attention; a derived line (one
        # event per op over the kernels) must not count them twice; another program's kernel
        # (a cast outside the train step) is no part of it.
        _plane("/device:GPU:0",
               Stream_7=[_event("gemm_fusion_dot.7", 400), _event("custom-call.12", 250), _event("custom-call.12", 50),
                         _event("convert.1", 30, module="jit_convert_element_type")],
               XLA_Ops=[_event("gemm_fusion_dot.7", 400), _event("custom-call.12", 300)]),
    ]
    ns, count, names, on_device = xla_profile._events_per_op(planes, "jit_train")
    assert on_device
    assert dict(ns) == {"gemm_fusion_dot.7": 400, "custom-call.12": 300}
    assert dict(count) == {"gemm_fusion_dot.7": 1, "custom-call.12": 2}
    assert names == ["/host:CPU", "/device:GPU:0"]


def test_a_cpu_trace_counts_every_thunk_it_holds():
    planes = [_plane("/host:CPU", thread_1=[_event("dot.3", 100)], thread_2=[_event("dot.3", 50), _event("add.1", 5)])]
    ns, count, _, on_device = xla_profile._events_per_op(planes, "jit_train")
    assert not on_device
    assert dict(ns) == {"dot.3": 150, "add.1": 5} and dict(count) == {"dot.3": 2, "add.1": 1}


def test_a_gpu_trace_without_a_device_plane_is_said_to_give_the_hosts_times():
    # The host's launch events stand in for the kernels then (the fallback above): the
    # profile says so instead of printing them as the GPU's.
    planes = [_plane("/host:CPU", XLA_thunks=[_event("gemm_fusion_dot.7", 5)])]
    *_, on_device = xla_profile._events_per_op(planes, "jit_train")
    assert "no gpu device plane" in xla_profile.host_times_note("gpu", on_device)
    assert xla_profile.host_times_note("gpu", True) is None  # a device's kernels: nothing to say
    assert xla_profile.host_times_note("cpu", on_device) is None  # a CPU's thunks are its work


def test_instructions_known_only_by_name_are_put_in_a_category_by_xlas_fusion_names():
    # On the H100 the trace names the scanned loop's slicing fusions, 9.8 ms of the large train
    # step's 69.6, which the compiled text read back does not hold: without their names they
    # would be "other" and "?". XLA:GPU names a fusion <kind>_<root opcode>_fusion.
    def by_name(name):
        return xla_profile.category("?", set(), False, name)

    assert by_name("loop_dynamic_update_slice_fusion.142") == "copy/layout"  # stacking what the loop saves
    assert by_name("loop_dynamic_slice_fusion.82") == "copy/layout"  # one layer's slice of a stack
    assert by_name("loop_broadcast_fusion.9") == "copy/layout"  # filling a stack before the loop
    assert by_name("input_reduce_fusion.3") == "reduction"
    assert by_name("input_multiply_reduce_fusion") == "reduction"
    assert by_name("gemm_fusion_dot.48") == "matmul"
    assert by_name("loop_multiply_fusion.2") == "elementwise"
    assert by_name("while.643") == "other"
    assert by_name("loop_dynamic_slice_fusion.clone.2") == "copy/layout"  # any suffix after the first dot
    assert by_name("loop_reduce_precision_fusion") == "elementwise"  # a rounding, no reduction
    # Found in the text, a fusion named for a dynamic-update-slice is data movement too, and a
    # bare dynamic-slice is data movement, not "other".
    assert xla_profile.category("fusion", {"dynamic-update-slice", "add"}, False, "loop_dynamic_update_slice_fusion") \
        == "copy/layout"
    assert xla_profile.category("dynamic-slice", set(), False, "dynamic-slice.4") == "copy/layout"
    assert xla_profile.phase("") == "unattributed"  # no JAX op name: XLA's own instruction


def test_the_profile_turns_command_buffers_off_unless_xla_flags_name_them():
    jax.devices()  # this process's backend has started: the flag comes too late, and says so
    environ = {}
    assert "backend started before the profile" in xla_profile.kernels_one_event_each(environ)
    assert environ == {"XLA_FLAGS": "--xla_gpu_enable_command_buffer="}
    environ = {"XLA_FLAGS": "--xla_dump_to=/tmp/d"}
    xla_profile.kernels_one_event_each(environ)
    assert environ == {"XLA_FLAGS": "--xla_dump_to=/tmp/d --xla_gpu_enable_command_buffer="}
    environ = {"XLA_FLAGS": "--xla_gpu_enable_command_buffer=FUSION"}  # the user's choice stands
    assert xla_profile.kernels_one_event_each(environ) is None
    assert environ == {"XLA_FLAGS": "--xla_gpu_enable_command_buffer=FUSION"}


def test_kernels_hidden_in_cuda_graphs_are_said_to_be():
    # An H100 profile with its kernels in CUDA graphs: eight command_buffer_N rows and nothing else.
    rows = [{"op": "command_buffer_310", "ms_per_step": 21.36}, {"op": "command_buffer_133", "ms_per_step": 14.8}]
    note = xla_profile.command_buffer_note(rows)
    assert "36.2 ms per call ran in 2 CUDA graphs" in note and "xla_gpu_enable_command_buffer" in note
    assert xla_profile.command_buffer_note([{"op": "gemm_fusion_dot.7", "ms_per_step": 1.0}]) is None


@pytest.mark.parametrize("tool", [xla_profile, ablations])
def test_the_profile_tools_refuse_a_gpu_preset_before_building_it_without_a_gpu(tool, monkeypatch):
    # Building the large preset's 207 M parameters on a CPU takes a minute before the cuDNN
    # attention refuses; the check comes before that. The tools' restart of the process
    # with GLIBC_TUNABLES is turned off: it would replace this pytest process.
    monkeypatch.setenv("FLAXFORMER_MINI_KEEP_FREED_MEMORY", "0")
    monkeypatch.delenv("XLA_FLAGS", raising=False)  # restored after: the profile sets it
    with pytest.raises(SystemExit, match="'large' is for a GPU and JAX sees none"):
        tool.main(["--preset", "large", "--scan-layers"])
