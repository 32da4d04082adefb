/* cuda_attn_dkdv.cu — the flash backward's dk/dv launcher: k_fl_bwd_dkdv
 * (cuda_attn_flash.cuh) at every head dim, 16-bit type and shared-memory
 * limit. A block owns 16 key rows a warp of one (batch, kv head) and
 * walks the query tiles of its group's query heads; grid [key row
 * blocks, Hkv, B]. In a source of its own so that nvcc builds it beside
 * the forward and dq (cuda_attn.cuh). */
#include "cuda_attn_flash.cuh"

namespace KN_NS
{

template <int DM, typename E> struct fl_dkdv_l {
    template <int LIMIT>
    static bool at(kn_ctx *c, void *dk, void *dv, fl_grad g, const float *lse, const void *q,
                   const void *k, const void *v, int B, int T, int Hq, int Hkv, int ldq, int ldkv,
                   fl_args a)
    {
        typedef fl_cfg<DM, E, fl_nw<FL_DKDV, DM, E, LIMIT>(), fl_buf<FL_DKDV, LIMIT>()> C;
        size_t smem = fl_smem<FL_DKDV, C>();
        if (!fl_smem_ok(c, k_fl_bwd_dkdv<C>, smem)) return false;
        const int BR = 16 * C::NW;
        dim3 grid((T + BR - 1) / BR, Hkv, B);
        KN_IO(k_fl_bwd_dkdv<C>, fl_bwd_bytes(fl_type<E>::dt, B, T, Hq, Hkv, DM),
              att_grad_bytes(dk, dv, a.gdt, B, T, Hkv, DM), 0);
        KN_LAUNCH(k_fl_bwd_dkdv<C>, grid, 32 * C::NW, smem, c, dk, dv, g, lse, q, k, v, T, Hq,
                  Hkv, ldq, ldkv, a);
        return true;
    }
};

bool fl_dkdv_launch(kn_ctx *c, kn_dtype dt, int D, void *dk, void *dv, fl_grad g,
                    const float *lse, const void *q, const void *k, const void *v, int B, int T,
                    int Hq, int Hkv, int ldq, int ldkv, fl_args a)
{
    return fl_launch<fl_dkdv_l>(c, dt, D, dk, dv, g, lse, q, k, v, B, T, Hq, Hkv, ldq, ldkv, a);
}

} // namespace KN_NS
