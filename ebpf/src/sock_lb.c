// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-only
/*
 * keelson socket-level load balancer (cgroup v2 sock_addr hooks).
 *
 * A Service address is translated once, when a socket names it:
 *   connect4/6      TCP and connected UDP: pick a backend, rewrite the
 *                   destination; remember (socket, backend) -> Service.
 *   sendmsg4/6      unconnected UDP: the same per datagram (sticky per
 *                   socket while the flow is active).
 *   recvmsg4/6      unconnected UDP replies: the source the application
 *                   sees is translated back to the Service address.
 *   getpeername4/6  the peer of a translated socket is the Service address.
 * No packet is ever NATed and no conntrack entry is created for these flows.
 *
 * Anything not found in kl_services (and Services with no backend) is left
 * untouched, so nftables still answers it (reject for "no endpoints").
 *
 * The maps are created and pinned under bpffs by userspace (netplane's ebpf
 * module), which reuses them when keelson restarts.
 */
#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "sock_lb.h"

char LICENSE[] SEC("license") = "GPL";

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC); /* replaced elements are freed after RCU: readers see old or new, never a mix */
	__uint(max_entries, 65536);
	__type(key, struct kl_svc_key);
	__type(value, struct kl_svc_value);
} kl_services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 524288);
	__type(key, struct kl_backend_key);
	__type(value, struct kl_backend_value);
} kl_backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 262144);
	__type(key, struct kl_member_key);
	__type(value, __u8);
} kl_members SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct kl_affinity_key);
	__type(value, struct kl_affinity_value);
} kl_affinity SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 131072);
	__type(key, struct kl_revnat_key);
	__type(value, struct kl_revnat_value);
} kl_revnat SEC(".maps");

/* A socket address as the hooks see it, independent of the family. */
struct kl_addr {
	__u32 addr[4];
	__u16 port; /* network byte order */
	__u8 family;
};

/* Is the remembered backend still serving the service? */
static __always_inline int kl_is_member(__u32 svc_id, const struct kl_affinity_value *b)
{
	struct kl_member_key mk = {};

	mk.svc_id = svc_id;
	mk.addr[0] = b->addr[0];
	mk.addr[1] = b->addr[1];
	mk.addr[2] = b->addr[2];
	mk.addr[3] = b->addr[3];
	mk.port = b->port;
	mk.family = b->family;
	return bpf_map_lookup_elem(&kl_members, &mk) != NULL;
}

/*
 * Reuses a remembered backend of kind `kind` for `cookie` when it is younger
 * than `timeout_ns` and still a member; writes it to `out`.
 */
static __always_inline int kl_remembered(__u64 cookie, __u32 kind, __u32 svc_id, __u64 timeout_ns,
					 __u64 now, struct kl_addr *out)
{
	struct kl_affinity_key ak = {};
	struct kl_affinity_value *av;

	ak.cookie = cookie;
	ak.svc_id = svc_id;
	ak.kind = kind;
	av = bpf_map_lookup_elem(&kl_affinity, &ak);
	if (!av)
		return 0;
	if (now - av->last_used_ns > timeout_ns || !kl_is_member(svc_id, av)) {
		bpf_map_delete_elem(&kl_affinity, &ak);
		return 0;
	}
	av->last_used_ns = now;
	out->addr[0] = av->addr[0];
	out->addr[1] = av->addr[1];
	out->addr[2] = av->addr[2];
	out->addr[3] = av->addr[3];
	out->port = av->port;
	out->family = av->family;
	return 1;
}

static __always_inline void kl_remember(__u64 cookie, __u32 kind, __u32 svc_id, __u64 now,
					const struct kl_addr *b)
{
	struct kl_affinity_key ak = {};
	struct kl_affinity_value av = {};

	ak.cookie = cookie;
	ak.svc_id = svc_id;
	ak.kind = kind;
	av.addr[0] = b->addr[0];
	av.addr[1] = b->addr[1];
	av.addr[2] = b->addr[2];
	av.addr[3] = b->addr[3];
	av.port = b->port;
	av.family = b->family;
	av.last_used_ns = now;
	bpf_map_update_elem(&kl_affinity, &ak, &av, BPF_ANY);
}

/*
 * Looks up `dst` (a Service address) and picks a backend into `dst`.
 * Returns 1 when `dst` was translated.
 */
static __always_inline int kl_translate(struct bpf_sock_addr *ctx, struct kl_addr *dst, __u8 proto,
					int udp_flow)
{
	struct kl_svc_key sk = {};
	struct kl_svc_value *sv;
	struct kl_backend_key bk = {};
	struct kl_backend_value *bv;
	struct kl_addr picked = {};
	__u32 svc_id, count, timeout;
	__u8 gen, flags;
	__u64 now;

	sk.addr[0] = dst->addr[0];
	sk.addr[1] = dst->addr[1];
	sk.addr[2] = dst->addr[2];
	sk.addr[3] = dst->addr[3];
	sk.port = dst->port;
	sk.proto = proto;
	sk.family = dst->family;
	sv = bpf_map_lookup_elem(&kl_services, &sk);
	if (!sv)
		return 0;
	/* Copy once: userspace replaces the whole element, never a field. */
	svc_id = sv->id;
	count = sv->count;
	gen = sv->gen;
	flags = sv->flags;
	timeout = sv->affinity_timeout;
	if (count == 0)
		return 0; /* no endpoint: nftables rejects it */

	now = bpf_ktime_get_ns();
	if (flags & KL_SVC_F_AFFINITY) {
		if (kl_remembered(bpf_get_netns_cookie(ctx), KL_AFF_CLIENT, svc_id,
				  (__u64)timeout * 1000000000ULL, now, &picked))
			goto done;
	}
	if (udp_flow) {
		if (kl_remembered(bpf_get_socket_cookie(ctx), KL_AFF_UDP_FLOW, svc_id,
				  KL_UDP_FLOW_TIMEOUT_NS, now, &picked))
			goto done;
	}

	bk.svc_id = svc_id;
	bk.gen = gen;
	bk.slot = (__u16)(bpf_get_prandom_u32() % count);
	bv = bpf_map_lookup_elem(&kl_backends, &bk);
	if (!bv)
		return 0; /* cannot happen with the write order userspace keeps */
	picked.addr[0] = bv->addr[0];
	picked.addr[1] = bv->addr[1];
	picked.addr[2] = bv->addr[2];
	picked.addr[3] = bv->addr[3];
	picked.port = bv->port;
	picked.family = bv->family;
	if (flags & KL_SVC_F_AFFINITY)
		kl_remember(bpf_get_netns_cookie(ctx), KL_AFF_CLIENT, svc_id, now, &picked);
	if (udp_flow)
		kl_remember(bpf_get_socket_cookie(ctx), KL_AFF_UDP_FLOW, svc_id, now, &picked);
done:
	if (picked.family != dst->family)
		return 0; /* a Service port's backends share its family */
	{
		struct kl_revnat_key rk = {};
		struct kl_revnat_value rv = {};

		rk.cookie = bpf_get_socket_cookie(ctx);
		rk.addr[0] = picked.addr[0];
		rk.addr[1] = picked.addr[1];
		rk.addr[2] = picked.addr[2];
		rk.addr[3] = picked.addr[3];
		rk.port = picked.port;
		rk.family = picked.family;
		rv.addr[0] = dst->addr[0];
		rv.addr[1] = dst->addr[1];
		rv.addr[2] = dst->addr[2];
		rv.addr[3] = dst->addr[3];
		rv.port = dst->port;
		rv.family = dst->family;
		bpf_map_update_elem(&kl_revnat, &rk, &rv, BPF_ANY);
	}
	dst->addr[0] = picked.addr[0];
	dst->addr[1] = picked.addr[1];
	dst->addr[2] = picked.addr[2];
	dst->addr[3] = picked.addr[3];
	dst->port = picked.port;
	return 1;
}

/* Translates a backend source back to the Service address, if this socket
 * was translated to that backend. Returns 1 when `src` was rewritten. */
static __always_inline int kl_reverse(struct bpf_sock_addr *ctx, struct kl_addr *src)
{
	struct kl_revnat_key rk = {};
	struct kl_revnat_value *rv;

	rk.cookie = bpf_get_socket_cookie(ctx);
	rk.addr[0] = src->addr[0];
	rk.addr[1] = src->addr[1];
	rk.addr[2] = src->addr[2];
	rk.addr[3] = src->addr[3];
	rk.port = src->port;
	rk.family = src->family;
	rv = bpf_map_lookup_elem(&kl_revnat, &rk);
	if (!rv || rv->family != src->family)
		return 0;
	src->addr[0] = rv->addr[0];
	src->addr[1] = rv->addr[1];
	src->addr[2] = rv->addr[2];
	src->addr[3] = rv->addr[3];
	src->port = rv->port;
	return 1;
}

/* ---- IPv4 ---- */

static __always_inline void kl_load4(struct bpf_sock_addr *ctx, struct kl_addr *a)
{
	a->addr[0] = ctx->user_ip4;
	a->addr[1] = 0;
	a->addr[2] = 0;
	a->addr[3] = 0;
	a->port = (__u16)ctx->user_port;
	a->family = KL_AF_INET;
}

static __always_inline void kl_store4(struct bpf_sock_addr *ctx, const struct kl_addr *a)
{
	ctx->user_ip4 = a->addr[0];
	ctx->user_port = a->port;
}

static __always_inline int kl_forward4(struct bpf_sock_addr *ctx, int udp_flow)
{
	struct kl_addr a = {};
	__u32 proto = ctx->protocol;

	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return 1;
	kl_load4(ctx, &a);
	if (kl_translate(ctx, &a, (__u8)proto, udp_flow))
		kl_store4(ctx, &a);
	return 1;
}

SEC("cgroup/connect4")
int kl_connect4(struct bpf_sock_addr *ctx)
{
	return kl_forward4(ctx, 0);
}

SEC("cgroup/sendmsg4")
int kl_sendmsg4(struct bpf_sock_addr *ctx)
{
	return kl_forward4(ctx, 1);
}

static __always_inline int kl_backward4(struct bpf_sock_addr *ctx)
{
	struct kl_addr a = {};

	kl_load4(ctx, &a);
	if (kl_reverse(ctx, &a))
		kl_store4(ctx, &a);
	return 1;
}

SEC("cgroup/recvmsg4")
int kl_recvmsg4(struct bpf_sock_addr *ctx)
{
	return kl_backward4(ctx);
}

SEC("cgroup/getpeername4")
int kl_getpeername4(struct bpf_sock_addr *ctx)
{
	return kl_backward4(ctx);
}

/* ---- IPv6 (and IPv4-mapped addresses on IPv6 sockets) ---- */

static __always_inline int kl_is_v4mapped(struct bpf_sock_addr *ctx)
{
	return ctx->user_ip6[0] == 0 && ctx->user_ip6[1] == 0 &&
	       ctx->user_ip6[2] == bpf_htonl(0x0000ffff);
}

static __always_inline void kl_load6(struct bpf_sock_addr *ctx, struct kl_addr *a)
{
	a->port = (__u16)ctx->user_port;
	if (kl_is_v4mapped(ctx)) {
		a->addr[0] = ctx->user_ip6[3];
		a->addr[1] = 0;
		a->addr[2] = 0;
		a->addr[3] = 0;
		a->family = KL_AF_INET;
		return;
	}
	a->addr[0] = ctx->user_ip6[0];
	a->addr[1] = ctx->user_ip6[1];
	a->addr[2] = ctx->user_ip6[2];
	a->addr[3] = ctx->user_ip6[3];
	a->family = KL_AF_INET6;
}

static __always_inline void kl_store6(struct bpf_sock_addr *ctx, const struct kl_addr *a)
{
	if (a->family == KL_AF_INET) {
		ctx->user_ip6[0] = 0;
		ctx->user_ip6[1] = 0;
		ctx->user_ip6[2] = bpf_htonl(0x0000ffff);
		ctx->user_ip6[3] = a->addr[0];
	} else {
		ctx->user_ip6[0] = a->addr[0];
		ctx->user_ip6[1] = a->addr[1];
		ctx->user_ip6[2] = a->addr[2];
		ctx->user_ip6[3] = a->addr[3];
	}
	ctx->user_port = a->port;
}

static __always_inline int kl_forward6(struct bpf_sock_addr *ctx, int udp_flow)
{
	struct kl_addr a = {};
	__u32 proto = ctx->protocol;

	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return 1;
	kl_load6(ctx, &a);
	if (kl_translate(ctx, &a, (__u8)proto, udp_flow))
		kl_store6(ctx, &a);
	return 1;
}

SEC("cgroup/connect6")
int kl_connect6(struct bpf_sock_addr *ctx)
{
	return kl_forward6(ctx, 0);
}

SEC("cgroup/sendmsg6")
int kl_sendmsg6(struct bpf_sock_addr *ctx)
{
	return kl_forward6(ctx, 1);
}

static __always_inline int kl_backward6(struct bpf_sock_addr *ctx)
{
	struct kl_addr a = {};

	kl_load6(ctx, &a);
	if (kl_reverse(ctx, &a))
		kl_store6(ctx, &a);
	return 1;
}

SEC("cgroup/recvmsg6")
int kl_recvmsg6(struct bpf_sock_addr *ctx)
{
	return kl_backward6(ctx);
}

SEC("cgroup/getpeername6")
int kl_getpeername6(struct bpf_sock_addr *ctx)
{
	return kl_backward6(ctx);
}
