/* cuda_attn_dq.cu — the flash backward's dq launcher: k_fl_bwd_dq
 * (cuda_attn_flash.cuh) at every head dim, 16-bit type and shared-memory
 * limit. A block owns 16 query rows a warp of one (batch, query head) and
 * walks their key tiles; grid [query row blocks, Hq, B]. In a source of
 * its own so that nvcc builds it beside the forward and dk/dv
 * (cuda_attn.cuh). */
#include "cuda_attn_flash.cuh"

namespace KN_NS
{

template <int DM, typename E> struct fl_dq_l {
    template <int LIMIT>
    static bool at(kn_ctx *c, void *dq, fl_grad g, const float *lse, const void *q, const void *k,
                   const void *v, int B, int T, int Hq, int Hkv, int ldq, int ldkv, fl_args a)
    {
        typedef fl_cfg<DM, E, fl_nw<FL_DQ, DM, E, LIMIT>(), fl_buf<FL_DQ, LIMIT>()> C;
        size_t smem = fl_smem<FL_DQ, C>();
        if (!fl_smem_ok(c, k_fl_bwd_dq<C>, smem)) return false;
        const int BR = 16 * C::NW;
        dim3 grid((T + BR - 1) / BR, Hq, B);
        KN_IO(k_fl_bwd_dq<C>, fl_bwd_bytes(fl_type<E>::dt, B, T, Hq, Hkv, DM),
              att_grad_bytes(dq, nullptr, a.gdt, B, T, Hq, DM), 0);
        KN_LAUNCH(k_fl_bwd_dq<C>, grid, 32 * C::NW, smem, c, dq, g, lse, q, k, v, T, Hq, Hkv, ldq,
                  ldkv, a);
        return true;
    }
};

bool fl_dq_launch(kn_ctx *c, kn_dtype dt, int D, void *dq, fl_grad g, const float *lse,
                  const void *q, const void *k, const void *v, int B, int T, int Hq, int Hkv,
                  int ldq, int ldkv, fl_args a)
{
    return fl_launch<fl_dq_l>(c, dt, D, dq, g, lse, q, k, v, B, T, Hq, Hkv, ldq, ldkv, a);
}

} // namespace KN_NS
