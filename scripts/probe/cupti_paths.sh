# Sourced by the CUPTI probes: sets CUPTI_INC (the folder holding cupti.h) and CUPTI_LIB
# (the one holding libcupti.so*), from CUDA's extras or the pip wheel PyTorch uses
# (nvidia/cu13); either empty when not found. Exports OMPS_CUPTI_LIB for the server.
CUPTI_INC=""; CUPTI_LIB=""
for d in /usr/local/cuda/extras/CUPTI $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, "cu13") for p in nvidia.__path__))' 2>/dev/null); do
    [ -f "$d/include/cupti.h" ] || continue
    CUPTI_INC=$d/include
    for l in "$d/lib64" "$d/lib"; do
        if ls "$l"/libcupti.so* > /dev/null 2>&1; then CUPTI_LIB=$l; break; fi
    done
    break
done
# The omps server started by a probe times traced clients' work with this CUPTI.
[ -n "$CUPTI_LIB" ] && export OMPS_CUPTI_LIB=${OMPS_CUPTI_LIB:-$CUPTI_LIB}
