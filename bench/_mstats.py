import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pootvk.config import config
from pootvk.plan.decode_schedule import DecodeProblem, choose_decode_schedule
from pootvk.shaders.attention_decode import generate_decode
from pootvk.shaders.compiler import compile_glsl
from pootvk.vk import Device

d = Device(None, dataclasses.replace(config(), pipeline_stats=True))
pr = d.profile
gqa = DecodeProblem(b=1, hq=32, hkv=8, lq=1, lk=32768, dk=128, dv=128, scale=0.1, kv_dtype="f16")
mla = DecodeProblem(b=1, hq=128, hkv=1, lq=1, lk=32768, dk=576, dv=512, scale=0.1,
                    kv_dtype="f16", dk_shared=64)
for name, p, ovs in (("gqa", gqa, [{"matrix": 16}, {"matrix": 16, "local_size": 256},
                                   {"matrix": 0}]),
                     ("mla", mla, [{}, {"local_size": 128}, {"prefetch": False},
                                   {"matrix_load": "direct"}])):
    for ov in ovs:
        r = choose_decode_schedule(p, pr, has_subgroup_shuffle=True, overrides=ov)
        pipe = d.compute_pipeline(compile_glsl(generate_decode(r)[0]), len(r.bindings()),
                                  len(r.push_constants()))
        st = pipe.statistics()
        keep = {k: v for k, v in st.items()
                if any(w in k.lower() for w in ("reg", "local", "shared"))}
        print(name, ov, keep, flush=True)
