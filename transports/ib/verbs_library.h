// libibverbs, opened with dlopen: the entry points the InfiniBand transport
// calls, resolved by name. libbraid is not linked with libibverbs, so it
// starts where rdma-core is absent; verbs.h is needed only at build time.
// Posting and polling (ibv_post_send, ibv_post_recv, ibv_poll_cq) are inline
// in verbs.h and call through the device context's own table, so they need
// no symbol here.
#pragma once

#include <infiniband/verbs.h>

#include <memory>
#include <string>

#include "src/common/status.h"

namespace braid::ib {

class VerbsLibrary {
 public:
  // notSupported when the library or one of the entry points is missing,
  // with the reason and the package that provides it.
  static Result<std::unique_ptr<VerbsLibrary>> open(const std::string& soname);
  ~VerbsLibrary();
  VerbsLibrary(const VerbsLibrary&) = delete;
  VerbsLibrary& operator=(const VerbsLibrary&) = delete;

  // The exported functions (several are also function-like macros in
  // verbs.h; naming them without arguments takes the function).
  decltype(&::ibv_get_device_list) getDeviceList = nullptr;
  decltype(&::ibv_free_device_list) freeDeviceList = nullptr;
  decltype(&::ibv_get_device_name) getDeviceName = nullptr;
  decltype(&::ibv_open_device) openDevice = nullptr;
  decltype(&::ibv_close_device) closeDevice = nullptr;
  decltype(&::ibv_query_device) queryDevice = nullptr;
  decltype(&::ibv_query_port) queryPortCompat = nullptr;  // see queryPort
  decltype(&::ibv_query_gid) queryGid = nullptr;
  decltype(&::ibv_alloc_pd) allocPd = nullptr;
  decltype(&::ibv_dealloc_pd) deallocPd = nullptr;
  decltype(&::ibv_reg_mr) regMr = nullptr;
  decltype(&::ibv_dereg_mr) deregMr = nullptr;
  decltype(&::ibv_create_cq) createCq = nullptr;
  decltype(&::ibv_destroy_cq) destroyCq = nullptr;
  decltype(&::ibv_create_qp) createQp = nullptr;
  decltype(&::ibv_destroy_qp) destroyQp = nullptr;
  decltype(&::ibv_modify_qp) modifyQp = nullptr;
  decltype(&::ibv_wc_status_str) wcStatusStr = nullptr;
  decltype(&::ibv_create_comp_channel) createCompChannel = nullptr;
  decltype(&::ibv_destroy_comp_channel) destroyCompChannel = nullptr;
  decltype(&::ibv_get_cq_event) getCqEvent = nullptr;
  decltype(&::ibv_ack_cq_events) ackCqEvents = nullptr;
  // Optional (null when absent): only reports the state of a queue pair.
  decltype(&::ibv_query_qp) queryQp = nullptr;

  // ibv_get_device_list's array, handed back to the library when dropped;
  // null (errno set) when the call fails.
  struct DeviceListFree {
    const VerbsLibrary* library;
    void operator()(ibv_device** list) const { library->freeDeviceList(list); }
  };
  using DeviceList = std::unique_ptr<ibv_device*, DeviceListFree>;
  DeviceList deviceList(int* count) const {
    return DeviceList(getDeviceList(count), DeviceListFree{this});
  }

  // The exported ibv_query_port fills the leading, long-stable part of
  // ibv_port_attr (state, MTU, LID, GID table length, link layer); the
  // rest is left zero.
  int queryPort(ibv_context* context, uint8_t port, ibv_port_attr* attr) const;

 private:
  explicit VerbsLibrary(void* handle) : handle_(handle) {}
  void* handle_;
};

}  // namespace braid::ib
