/* cuda_attn_fwd.cu — the flash forward's launcher: k_fl_fwd
 * (cuda_attn_flash.cuh) at every head dim, 16-bit type and shared-memory
 * limit. A block owns 16 query rows a warp of one (batch, query head);
 * grid [query row blocks, Hq, B]. In a source of its own so that nvcc
 * builds it beside dq and dk/dv (cuda_attn.cuh). */
#include "cuda_attn_flash.cuh"

namespace KN_NS
{

template <int DM, typename E> struct fl_fwd_l {
    template <int LIMIT>
    static bool at(kn_ctx *c, void *out, float *lse, const void *q, const void *k, const void *v,
                   int B, int Tq, int Tk, int Hq, int Hkv, int ldq, int ldkv, fl_args a)
    {
        typedef fl_cfg<DM, E, fl_nw<FL_FWD, DM, E, LIMIT>(), fl_buf<FL_FWD, LIMIT>()> C;
        size_t smem = fl_smem<FL_FWD, C>();
        if (!fl_smem_ok(c, k_fl_fwd<C>, smem)) return false;
        const int BR = 16 * C::NW;
        dim3 grid((Tq + BR - 1) / BR, Hq, B);
        KN_IO(k_fl_fwd<C>, att_bytes(fl_type<E>::dt, B, Tq, Tk, Hq, Hkv, DM, 0),
              att_bytes(fl_type<E>::dt, B, Tq, Tk, Hq, 0, DM, 1), 0);
        KN_LAUNCH(k_fl_fwd<C>, grid, 32 * C::NW, smem, c, out, lse, q, k, v, Tq, Tk, Hq, Hkv, ldq,
                  ldkv, a);
        return true;
    }
};

bool fl_fwd_launch(kn_ctx *c, kn_dtype dt, int D, void *out, float *lse, const void *q,
                   const void *k, const void *v, int B, int Tq, int Tk, int Hq, int Hkv, int ldq,
                   int ldkv, fl_args a)
{
    return fl_launch<fl_fwd_l>(c, dt, D, out, lse, q, k, v, B, Tq, Tk, Hq, Hkv, ldq, ldkv, a);
}

} // namespace KN_NS
