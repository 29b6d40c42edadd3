/* SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-only */
/*
 * Map layouts of keelson's socket-level load balancer.
 *
 * userspace (netplane/src/ebpf/layout.rs) encodes and decodes these structs
 * byte for byte; every field is explicit (no implicit padding) and the
 * sizes are checked at compile time below. Change both sides together and
 * bump KL_LAYOUT_VERSION: a pinned map whose key/value sizes differ from the
 * loaded object is replaced at start (its state is lost, which is logged).
 *
 * Addresses are stored in network byte order as four 32-bit words; an IPv4
 * address uses word 0 and leaves words 1..3 zero. Ports are stored in network
 * byte order in a 16-bit field.
 */
#ifndef KEELSON_SOCK_LB_H
#define KEELSON_SOCK_LB_H

#include <linux/types.h>

#define KL_LAYOUT_VERSION 1

#define KL_AF_INET 2
#define KL_AF_INET6 10

/* svc_value.flags */
#define KL_SVC_F_AFFINITY 0x01 /* sessionAffinity: ClientIP */

/* affinity_key.kind */
#define KL_AFF_CLIENT 0   /* ClientIP affinity, keyed by the client's netns cookie */
#define KL_AFF_UDP_FLOW 1 /* unconnected UDP flow, keyed by the socket cookie */

/* An unconnected UDP socket keeps sending to the backend it picked while
 * datagrams keep flowing, like the conntrack entry kube-proxy relies on
 * (nf_conntrack_udp_timeout: 30 s). */
#define KL_UDP_FLOW_TIMEOUT_NS (30ULL * 1000000000ULL)

/* kl_services: (VIP, port, protocol) -> service entry. */
struct kl_svc_key {
	__u32 addr[4];
	__u16 port;
	__u8 proto;  /* IPPROTO_TCP / IPPROTO_UDP */
	__u8 family; /* KL_AF_INET / KL_AF_INET6 */
};

struct kl_svc_value {
	__u32 id;               /* service-port id, unique per node */
	__u16 count;            /* backends in the active generation */
	__u8 gen;               /* active generation of the slot array: 0 or 1 */
	__u8 flags;             /* KL_SVC_F_* */
	__u32 affinity_timeout; /* seconds (sessionAffinityConfig.clientIP.timeoutSeconds) */
	__u32 reserved;
};

/* kl_backends: (service id, generation, slot) -> backend address. */
struct kl_backend_key {
	__u32 svc_id;
	__u16 slot;
	__u8 gen;
	__u8 reserved;
};

struct kl_backend_value {
	__u32 addr[4];
	__u16 port;
	__u8 family;
	__u8 reserved;
};

/* kl_members: (service id, backend) -> 1 while the backend serves the
 * service; checked before a remembered (affinity or UDP flow) backend is
 * reused, so a removed backend never receives new traffic. */
struct kl_member_key {
	__u32 svc_id;
	__u32 addr[4];
	__u16 port;
	__u8 family;
	__u8 reserved;
};

/* kl_affinity (LRU): remembered backend choices. */
struct kl_affinity_key {
	__u64 cookie; /* netns cookie (KL_AFF_CLIENT) or socket cookie (KL_AFF_UDP_FLOW) */
	__u32 svc_id;
	__u32 kind;
};

struct kl_affinity_value {
	__u32 addr[4];
	__u16 port;
	__u8 family;
	__u8 reserved;
	__u32 reserved2;
	__u64 last_used_ns; /* bpf_ktime_get_ns() of the last use */
};

/* kl_revnat (LRU): (socket cookie, backend) -> the Service address the
 * application asked for; used by recvmsg (reply source) and getpeername. */
struct kl_revnat_key {
	__u64 cookie;
	__u32 addr[4];
	__u16 port;
	__u8 family;
	__u8 reserved;
	__u32 reserved2;
};

struct kl_revnat_value {
	__u32 addr[4];
	__u16 port;
	__u8 family;
	__u8 reserved;
};

_Static_assert(sizeof(struct kl_svc_key) == 20, "kl_svc_key layout");
_Static_assert(sizeof(struct kl_svc_value) == 16, "kl_svc_value layout");
_Static_assert(sizeof(struct kl_backend_key) == 8, "kl_backend_key layout");
_Static_assert(sizeof(struct kl_backend_value) == 20, "kl_backend_value layout");
_Static_assert(sizeof(struct kl_member_key) == 24, "kl_member_key layout");
_Static_assert(sizeof(struct kl_affinity_key) == 16, "kl_affinity_key layout");
_Static_assert(sizeof(struct kl_affinity_value) == 32, "kl_affinity_value layout");
_Static_assert(sizeof(struct kl_revnat_key) == 32, "kl_revnat_key layout");
_Static_assert(sizeof(struct kl_revnat_value) == 20, "kl_revnat_value layout");

#endif
