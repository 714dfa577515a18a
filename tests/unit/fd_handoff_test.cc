// fd_handoff.h: descriptors handed to other processes of this host over a
// Unix socket, to those that present the ticket and are of this user only.
#include "transports/cuda_ipc/fd_handoff.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace braid::transport::cuda_ipc {
namespace {

// A memfd holding `text`.
tcp::Fd fileWith(const std::string& text) {
  tcp::Fd fd(memfd_create("fd-handoff-test", MFD_CLOEXEC));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(pwrite(fd.get(), text.data(), text.size(), 0), static_cast<ssize_t>(text.size()));
  return fd;
}

std::string contents(int fd) {
  char buffer[64] = {};
  const ssize_t n = pread(fd, buffer, sizeof(buffer), 0);
  return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : std::string();
}

TEST(FdHandoff, ATicketFetchesTheSameFileNotACopy) {
  auto server = FdServer::start();
  ASSERT_TRUE(server.isOk()) << server.status().message();
  auto ticket = (*server)->offer(fileWith("first"));
  ASSERT_TRUE(ticket.isOk());
  auto fetched = fetchFd(*ticket);
  ASSERT_TRUE(fetched.isOk()) << fetched.status().message();
  EXPECT_EQ(contents(fetched->get()), "first");
  // Written through the fetched descriptor, read through another fetch: one file.
  ASSERT_EQ(pwrite(fetched->get(), "again", 5, 0), 5);
  auto second = fetchFd(*ticket);
  ASSERT_TRUE(second.isOk());
  EXPECT_EQ(contents(second->get()), "again");
}

TEST(FdHandoff, AWrongProofOrAWithdrawnOfferIsRefused) {
  auto server = FdServer::start();
  ASSERT_TRUE(server.isOk());
  auto ticket = (*server)->offer(fileWith("secret"));
  ASSERT_TRUE(ticket.isOk());
  FdTicket forged = *ticket;
  forged.proof[3] ^= 1;
  auto refused = fetchFd(forged);
  ASSERT_FALSE(refused.isOk());
  EXPECT_EQ(refused.status().code(), ErrorCode::kRemoteError);
  EXPECT_NE(refused.status().message().find("refused"), std::string::npos)
      << refused.status().message();
  FdTicket otherId = *ticket;
  ++otherId.id;
  EXPECT_FALSE(fetchFd(otherId).isOk());
  (*server)->withdraw(ticket->id);
  EXPECT_FALSE(fetchFd(*ticket).isOk());
}

// Clients that connect and say nothing hold up no one: the server answers
// the others meanwhile (it used to give each silent client a second of its
// own, in turn), and closes a silent client after a second.
TEST(FdHandoff, SilentClientsHoldUpNoOne) {
  auto server = FdServer::start();
  ASSERT_TRUE(server.isOk());
  auto ticket = (*server)->offer(fileWith("shared"));
  ASSERT_TRUE(ticket.isOk());
  std::vector<tcp::Fd> silent;
  for (int i = 0; i < 3; ++i) {
    auto client = connectToFdServer(*ticket, 5000);
    ASSERT_TRUE(client.isOk()) << client.status().message();
    silent.push_back(std::move(*client));
  }
  auto fetched = fetchFd(*ticket, 500);
  ASSERT_TRUE(fetched.isOk()) << fetched.status().message();
  EXPECT_EQ(contents(fetched->get()), "shared");
  for (const tcp::Fd& client : silent) {
    pollfd readable{client.get(), POLLIN, 0};
    ASSERT_EQ(poll(&readable, 1, 5000), 1) << "a silent client was still connected after 5 s";
    char byte = 0;
    EXPECT_EQ(recv(client.get(), &byte, 1, 0), 0) << "closed without an answer";
  }
}

TEST(FdHandoff, AServerThatIsGoneCannotBeReachedAndSaysSo) {
  FdTicket ticket;
  {
    auto server = FdServer::start();
    ASSERT_TRUE(server.isOk());
    auto offered = (*server)->offer(fileWith("x"));
    ASSERT_TRUE(offered.isOk());
    ticket = *offered;
  }
  auto gone = fetchFd(ticket);
  ASSERT_FALSE(gone.isOk());
  EXPECT_NE(gone.status().message().find("cannot be reached"), std::string::npos)
      << gone.status().message();
}

// Runs `child` in a forked process; its exit code.
template <typename Child>
int inChild(Child child) {
  const pid_t pid = fork();
  if (pid == 0) _exit(child());
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

TEST(FdHandoff, AnotherProcessOfThisUserGetsTheFile) {
  auto server = FdServer::start();
  ASSERT_TRUE(server.isOk());
  auto ticket = (*server)->offer(fileWith("shared"));
  ASSERT_TRUE(ticket.isOk());
  const FdTicket t = *ticket;
  EXPECT_EQ(inChild([&] {
              auto fd = fetchFd(t);
              if (!fd.isOk() || contents(fd->get()) != "shared") return 1;
              return pwrite(fd->get(), "CHILD!", 6, 0) == 6 ? 0 : 2;
            }),
            0);
  auto mine = fetchFd(t);
  ASSERT_TRUE(mine.isOk());
  EXPECT_EQ(contents(mine->get()), "CHILD!");
}

// A process at its limit of open files gets the answer but not the
// descriptor: the kernel drops it (MSG_CTRUNC). That is this process's
// limit, to be named as such, not a refusal by the owner, which the caller
// would take for memory freed meanwhile and say nothing of.
TEST(FdHandoff, AProcessAtItsLimitOfOpenFilesIsToldSo) {
  auto server = FdServer::start();
  ASSERT_TRUE(server.isOk());
  auto ticket = (*server)->offer(fileWith("shared"));
  ASSERT_TRUE(ticket.isOk());
  const FdTicket t = *ticket;
  EXPECT_EQ(inChild([&] {
              // The lowest free descriptor is the socket's; none past it.
              const int lowest = dup(0);
              if (lowest < 0) return 3;
              close(lowest);
              const rlimit limit{static_cast<rlim_t>(lowest) + 1, static_cast<rlim_t>(lowest) + 1};
              if (setrlimit(RLIMIT_NOFILE, &limit) != 0) return 4;
              auto fd = fetchFd(t);
              if (fd.isOk()) return 1;
              std::fprintf(stderr, "%s\n", fd.status().message().c_str());
              if (fd.status().code() != ErrorCode::kSystemError) return 2;
              return fd.status().message().find("limit of open files") != std::string::npos ? 0 : 5;
            }),
            0);
}

TEST(FdHandoff, AProcessOfAnotherUserIsRefusedEvenWithTheTicket) {
  if (geteuid() != 0)
    GTEST_SKIP() << "needs root, to run a process as another user (CI runs as root)";
  auto server = FdServer::start();
  ASSERT_TRUE(server.isOk());
  auto ticket = (*server)->offer(fileWith("mine"));
  ASSERT_TRUE(ticket.isOk());
  const FdTicket t = *ticket;
  EXPECT_EQ(inChild([&] {
              if (setgid(65534) != 0 || setuid(65534) != 0) return 3;
              auto fd = fetchFd(t);
              if (fd.isOk()) return 1;
              return fd.status().message().find("refused") != std::string::npos ? 0 : 2;
            }),
            0);
}

}  // namespace
}  // namespace braid::transport::cuda_ipc
