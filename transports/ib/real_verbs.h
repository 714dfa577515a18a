// The verbs of verbs.h over libibverbs, opened with dlopen (VerbsLibrary).
// Built only where the verbs headers are (BRAID_IB_VERBS=1).
//
// What differs from the model, because hardware does it: writes run
// asynchronously after the post returns; a completion queue overrun is an
// asynchronous event, not a poll error (size the queue for every
// outstanding work request, as verbs requires); and state() asks the
// device when the library has ibv_query_qp, else reports the state last
// set.
#pragma once

#include <memory>
#include <string>

#include "transports/ib/verbs.h"

namespace braid::ib {

class VerbsLibrary;

// The named device, or the first one when `name` is empty. Every object
// made from it keeps `library` loaded.
Result<std::unique_ptr<Device>> openVerbsDevice(std::shared_ptr<const VerbsLibrary> library,
                                                const std::string& name = "");

}  // namespace braid::ib
