import dataclasses, json, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pootvk.config import config
from pootvk.plan.decode_schedule import DecodeProblem, choose_decode_schedule
from pootvk.shaders.attention_decode import generate_decode
from pootvk.shaders.compiler import compile_glsl
from pootvk.vk import Device
d = Device(None, dataclasses.replace(config(), pipeline_stats=True))
pr = d.profile
cases = [("gqa", DecodeProblem(b=1,hq=32,hkv=8,lq=1,lk=32768,dk=128,dv=128,scale=0.1,kv_dtype="f16"), [{}, {"local_size":256}, {"prefetch": False}]),
         ("mla", DecodeProblem(b=1,hq=128,hkv=1,lq=1,lk=32768,dk=576,dv=512,scale=0.1,kv_dtype="f16",dk_shared=64), [{}, {"local_size":256}, {"local_size":256, "prefetch": True}, {"rows_per_wg": 8}])]
for name, p, ovs in cases:
    for ov in ovs:
        try:
            r = choose_decode_schedule(p, pr, has_subgroup_shuffle=True, overrides=ov)
        except Exception as e:
            print(name, ov, "refused", e); continue
        pipe = d.compute_pipeline(compile_glsl(generate_decode(r)[0]), len(r.bindings()), len(r.push_constants()))
        st = pipe.statistics()
        print(name, ov, r.shared_bytes, {k: v for k, v in st.items() if any(w in k.lower() for w in ("reg", "spill", "local", "stack", "instr", "shared"))}, flush=True)
