#include "transports/ib/verbs_library.h"

#include <dlfcn.h>

#include <cstring>

#include "src/common/strcat.h"

namespace braid::ib {

Result<std::unique_ptr<VerbsLibrary>> VerbsLibrary::open(const std::string& soname) {
  void* handle = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    return notSupported(strCat("cannot load ", soname, " (", why ? why : "unknown error",
                               "); it comes with rdma-core (Debian: libibverbs1)"));
  }
  std::unique_ptr<VerbsLibrary> lib(new VerbsLibrary(handle));
  std::string missing;
  auto resolve = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
    if (!fn) missing += strCat(missing.empty() ? "" : ", ", name);
  };
  resolve(lib->getDeviceList, "ibv_get_device_list");
  resolve(lib->freeDeviceList, "ibv_free_device_list");
  resolve(lib->getDeviceName, "ibv_get_device_name");
  resolve(lib->openDevice, "ibv_open_device");
  resolve(lib->closeDevice, "ibv_close_device");
  resolve(lib->queryDevice, "ibv_query_device");
  resolve(lib->queryPortCompat, "ibv_query_port");
  resolve(lib->queryGid, "ibv_query_gid");
  resolve(lib->allocPd, "ibv_alloc_pd");
  resolve(lib->deallocPd, "ibv_dealloc_pd");
  resolve(lib->regMr, "ibv_reg_mr");
  resolve(lib->deregMr, "ibv_dereg_mr");
  resolve(lib->createCq, "ibv_create_cq");
  resolve(lib->destroyCq, "ibv_destroy_cq");
  resolve(lib->createQp, "ibv_create_qp");
  resolve(lib->destroyQp, "ibv_destroy_qp");
  resolve(lib->modifyQp, "ibv_modify_qp");
  resolve(lib->wcStatusStr, "ibv_wc_status_str");
  resolve(lib->createCompChannel, "ibv_create_comp_channel");
  resolve(lib->destroyCompChannel, "ibv_destroy_comp_channel");
  resolve(lib->getCqEvent, "ibv_get_cq_event");
  resolve(lib->ackCqEvents, "ibv_ack_cq_events");
  lib->queryQp = reinterpret_cast<decltype(lib->queryQp)>(dlsym(handle, "ibv_query_qp"));
  if (!missing.empty())
    return notSupported(
        strCat(soname, " lacks ", missing, " (rdma-core too old, or not libibverbs)"));
  return lib;
}

VerbsLibrary::~VerbsLibrary() {
  dlclose(handle_);
}

int VerbsLibrary::queryPort(ibv_context* context, uint8_t port, ibv_port_attr* attr) const {
  std::memset(attr, 0, sizeof(*attr));
  return queryPortCompat(context, port, reinterpret_cast<_compat_ibv_port_attr*>(attr));
}

}  // namespace braid::ib
