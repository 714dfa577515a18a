/* A stand-in for libibverbs.so.1 with the entry points braid resolves, for
 * the loader's tests: FAKE_IBVERBS selects what ibv_get_device_list finds.
 *   enosys   NULL with errno ENOSYS (a kernel without RDMA)
 *   empty    an empty list
 *   down     one device, "fake0", whose only port is down
 *   roce     "fake0": port 1 active over Ethernet (RoCE), port 2 down over InfiniBand
 */
#include <sys/eventfd.h>
#include <unistd.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdlib.h>
#include <string.h>

static struct ibv_device fake_device;
static struct ibv_context fake_context;

static const char* mode(void) {
  const char* m = getenv("FAKE_IBVERBS");
  return m ? m : "enosys";
}

#undef ibv_get_device_list
struct ibv_device** ibv_get_device_list(int* num) {
  if (strcmp(mode(), "enosys") == 0) {
    if (num) *num = 0;
    errno = ENOSYS;
    return NULL;
  }
  struct ibv_device** list = calloc(2, sizeof(*list));
  int n = 0;
  if (strcmp(mode(), "empty") != 0) list[n++] = &fake_device;
  if (num) *num = n;
  return list;
}

void ibv_free_device_list(struct ibv_device** list) {
  free(list);
}

const char* ibv_get_device_name(struct ibv_device* device) {
  (void)device;
  return "fake0";
}

struct ibv_context* ibv_open_device(struct ibv_device* device) {
  fake_context.device = device;
  return &fake_context;
}

int ibv_close_device(struct ibv_context* context) {
  (void)context;
  return 0;
}

int ibv_query_device(struct ibv_context* context, struct ibv_device_attr* attr) {
  (void)context;
  memset(attr, 0, sizeof(*attr));
  attr->phys_port_cnt = strcmp(mode(), "roce") == 0 ? 2 : 1;
  return 0;
}

/* The exported symbols; verbs.h hides some behind macros of the same name. */
#undef ibv_query_port
int ibv_query_port(struct ibv_context* context, uint8_t port, struct _compat_ibv_port_attr* out) {
  (void)context;
  struct ibv_port_attr* attr = (struct ibv_port_attr*)out;
  int roce = strcmp(mode(), "roce") == 0;
  attr->state = roce && port == 1 ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
  attr->link_layer = roce && port == 1 ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
  attr->lid = roce && port == 1 ? 0 : 7;
  attr->gid_tbl_len = 2;
  return 0;
}

/* Resolved by the loader, not called by its tests. */
int ibv_query_gid(struct ibv_context* c, uint8_t port, int index, union ibv_gid* gid) {
  (void)c, (void)port, (void)index, (void)gid;
  return ENOSYS;
}
struct ibv_pd* ibv_alloc_pd(struct ibv_context* c) {
  (void)c;
  return NULL;
}
int ibv_dealloc_pd(struct ibv_pd* pd) {
  (void)pd;
  return ENOSYS;
}
#undef ibv_reg_mr
struct ibv_mr* ibv_reg_mr(struct ibv_pd* pd, void* addr, size_t length, int access) {
  (void)pd, (void)addr, (void)length, (void)access;
  return NULL;
}
int ibv_dereg_mr(struct ibv_mr* mr) {
  (void)mr;
  return ENOSYS;
}
struct ibv_cq* ibv_create_cq(struct ibv_context* c, int cqe, void* user,
                             struct ibv_comp_channel* ch, int vector) {
  (void)c, (void)cqe, (void)user, (void)ch, (void)vector;
  return NULL;
}
/* A channel that works, so that queue creation fails where the tests expect. */
struct ibv_comp_channel* ibv_create_comp_channel(struct ibv_context* c) {
  struct ibv_comp_channel* channel = calloc(1, sizeof(*channel));
  if (!channel) return NULL;
  channel->context = c;
  channel->fd = eventfd(0, EFD_CLOEXEC);
  return channel;
}
int ibv_destroy_comp_channel(struct ibv_comp_channel* channel) {
  close(channel->fd);
  free(channel);
  return 0;
}
int ibv_get_cq_event(struct ibv_comp_channel* channel, struct ibv_cq** cq, void** context) {
  (void)channel, (void)cq, (void)context;
  return -1;
}
void ibv_ack_cq_events(struct ibv_cq* cq, unsigned int nevents) {
  (void)cq, (void)nevents;
}
int ibv_destroy_cq(struct ibv_cq* cq) {
  (void)cq;
  return ENOSYS;
}
struct ibv_qp* ibv_create_qp(struct ibv_pd* pd, struct ibv_qp_init_attr* attr) {
  (void)pd, (void)attr;
  return NULL;
}
int ibv_destroy_qp(struct ibv_qp* qp) {
  (void)qp;
  return ENOSYS;
}
int ibv_modify_qp(struct ibv_qp* qp, struct ibv_qp_attr* attr, int mask) {
  (void)qp, (void)attr, (void)mask;
  return ENOSYS;
}
const char* ibv_wc_status_str(enum ibv_wc_status status) {
  (void)status;
  return "fake";
}
