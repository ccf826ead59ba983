"""The exec agents' zygote: one long-lived host process per broker with the exec agent's code
already loaded (``exec_agent.py``), which forks each local sandbox's agent into the namespaces that
bubblewrap made for it. A sandbox's agent then costs a fork, not a fresh interpreter.

Bubblewrap still sets each sandbox up, from the same command line as any of its commands
(``local_commands.sandbox_prefix``: cgroups, rlimits, the egress namespace, the uid, every
namespace, the mounts, no capabilities, no new privileges, no further user namespaces), with
``--as-pid-1`` and a stub as its command (``agents.STUB``): a shell reading a pipe that the broker
holds, the namespace's init (its signals are out of the sandbox's reach, and the agent's
``kill(-1)`` spares it). The broker hands the zygote the stub's host pid and the agent's end of a
socket pair (SCM_RIGHTS); the zygote forks the agent straight into the stub's pid namespace (it
enters that namespace for its children only while it forks, then goes back), and the child, still
root on the host, joins the sandbox's cgroups, sets its rlimits, enters the stub's cgroup, ipc, uts,
net and mount namespaces and, last, its user namespace (bubblewrap's innermost one, which may make no
further user namespace), drops every capability (bounding, ambient, effective, permitted,
inheritable), takes the sandbox uid and gid with no supplementary groups, sets no-new-privileges and
serves: it starts a session of its own and becomes the subreaper of its commands (the stub reaps
nothing). The zygote is its parent and reaps it as it ends (SIGCHLD). One fork per agent: an
intermediate child, forked to enter the namespaces and fork the agent, cost a fork and an exit more.

The zygote also starts each sandbox's bubblewrap (a ``spawn`` request): its child, still root on the
host, does what ``sh -c 'echo $$ > cgroup.procs; ulimit ...'``, ``nsenter`` and ``setpriv`` did, one
exec each, before bubblewrap: it joins the sandbox's cgroups, sets its rlimits, starts a session,
enters the egress and launch namespaces, drops to the sandbox uid with no groups and no capabilities
(bounding, ambient, effective, permitted, inheritable) and no new privileges, restores the signals
Python ignores, and execs bubblewrap on the descriptors the broker sent. Three program starts fewer
per sandbox. The broker gets the child's pidfd back (it is not the broker's child: the zygote reaps
it), so bubblewrap's ``--die-with-parent`` ties the sandbox to the zygote, whose own end is the
broker's.

This file runs on the host's python3 (the interpreter the agents run on) with ``exec_agent.py``'s
source executed first in the same globals; it uses the standard library only.
"""

from __future__ import annotations

import _signal  # not ``signal``, whose enums import more than the zygote needs
import ctypes
import gc
import marshal
import os
import resource
import socket
import sys

TYPE_CHECKING = False  # not ``typing``'s: the zygote loads no more than it needs (its forks copy it)
if TYPE_CHECKING:
    from typing import Any

if __name__ != "zygote":  # imported on the broker's side (names and checks); the zygote has them in its globals
    from services.sandbox_broker.backends.exec_agent import serve

# setns(2) flags, in the order the namespaces are entered: the user namespace last (from it, the
# others, which belong to its parent, could no longer be entered)
NAMESPACES = (("cgroup", 0x02000000), ("ipc", 0x08000000), ("uts", 0x04000000), ("net", 0x40000000),
              ("pid", 0x20000000), ("mnt", 0x00020000), ("user", 0x10000000))  # fmt: skip
PID_NAMESPACE = 0x20000000
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
PR_SET_CHILD_SUBREAPER = 36
CAPABILITY_VERSION_3 = 0x20080522
RLIMITS = {"n": (resource.RLIMIT_NOFILE, 1), "f": (resource.RLIMIT_FSIZE, 512), "v": (resource.RLIMIT_AS, 1024)}
MAX_REQUEST = 65_536
REAP_EVERY_S = 2.0  # with no request coming, ended bubblewraps are collected this often


class Zygote:
    def __init__(self) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        with open("/proc/sys/kernel/cap_last_cap") as f:
            self.last_cap = int(f.read())
        self.own_pid_namespace = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    def enter(self, request: dict[str, Any]) -> None:
        """As the forked child, root on the host, born in the sandbox's pid namespace: become one of
        the sandbox's processes."""
        self.join(request)
        stub = request["stub"]
        opened = [(os.open(f"/proc/{stub}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC), name, flag)
                  for name, flag in NAMESPACES if name != "pid"]  # fmt: skip
        os.setgroups([])  # before the user namespace: bubblewrap denies setgroups in it
        self.setns(opened)
        self.drop(int(request["uid"]))
        os.chdir(str(request["cwd"]))

    def join(self, request: dict[str, Any]) -> None:
        """Into the sandbox's cgroups, under its rlimits."""
        for path in request["procs"]:
            with open(path, "w") as f:
                f.write(str(os.getpid()))
        for flag, value in request["rlimits"].items():
            kind, unit = RLIMITS[flag]
            resource.setrlimit(kind, (value * unit, value * unit))

    def setns(self, opened: list[tuple[int, str, int]]) -> None:
        for fd, name, flag in opened:
            self.check(self.libc.setns(fd, flag), f"setns({name})")
            os.close(fd)

    def drop(self, uid: int) -> None:
        """Root to ``uid``: no capability in any set, no new privileges."""
        for cap in range(self.last_cap + 1):
            self.check(self.libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "drop the capability bounding set")
        self.check(self.libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities")
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        header, data = (ctypes.c_uint32 * 2)(CAPABILITY_VERSION_3, 0), (ctypes.c_uint32 * 6)()
        self.check(self.libc.capset(header, data), "capset")  # none left: effective, permitted, inheritable
        self.check(self.libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")

    def launch(self, request: dict[str, Any], fds: list[int]) -> None:
        """In the forked child: become the sandbox's bubblewrap (``fds``: its stdin, stdout, stderr)."""
        log = fds[2]
        try:
            os.setsid()
            self.join(request)
            opened = [(os.open(path, os.O_RDONLY | os.O_CLOEXEC), path, flag) for path, flag in request["namespaces"]]
            os.setgroups([])
            self.setns(opened)
            self.drop(int(request["uid"]))
            for number in (_signal.SIGPIPE, _signal.SIGXFSZ):  # ignored here; restored, as Popen does
                _signal.signal(number, _signal.SIG_DFL)
            for target, fd in enumerate(fds[:3]):
                os.dup2(fd, target)
            log = 2
            os.closerange(3, os.sysconf("SC_OPEN_MAX"))
            argv = list(request["argv"])
            os.execve(argv[0], argv, dict(request["env"]))
        except BaseException as exc:
            try:
                os.write(log, f"zygote: the sandbox {request.get('sandbox')} did not start: {exc!r}\n".encode())
            except OSError:
                pass
        finally:
            os._exit(127)

    def agent(self, channel: int, log: int) -> None:
        """The forked agent, in the sandbox's pid namespace: serve on ``channel`` until it closes."""
        os.setsid()
        self.check(self.libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "subreaper")
        os.dup2(channel, 0)
        os.dup2(channel, 1)
        os.dup2(log, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        globals()["REAPER"] = True  # exec_agent's: it collects its commands' orphans (it is not pid 1)
        with open(0, "rb", closefd=False) as inp, open(1, "wb", closefd=False) as out:
            serve(inp, out)

    def fork(self, control: socket.socket, request: dict[str, Any], channel: int, log: int) -> None:
        """Fork the agent straight into the sandbox's pid namespace: while the zygote forks, its
        children are born there (setns(CLONE_NEWPID) moves where its children go, not the zygote),
        then it goes back to its own; the child enters the sandbox's other namespaces itself. The
        zygote is the agent's parent (it reaps it); if the sandbox's pid 1 ends first, the agent is
        the namespace's to kill."""
        target = os.open(f"/proc/{request['stub']}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        try:
            self.check(self.libc.setns(target, PID_NAMESPACE), "setns(pid)")
        finally:
            os.close(target)
        try:
            if os.fork() == 0:
                control.close()
                try:
                    _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)  # the zygote's handler is not the agent's
                    self.enter(request)
                    self.agent(channel, log)
                except BaseException as exc:
                    message = f"zygote: the agent of {request.get('sandbox')} did not start: {exc!r}\n"
                    os.write(log, message.encode())
                finally:
                    os._exit(0)
        finally:  # back, or never go on: the next bubblewrap would be born in this sandbox's namespace
            if self.libc.setns(self.own_pid_namespace, PID_NAMESPACE) != 0:
                os._exit(70)

    def serve(self, control: socket.socket) -> None:
        """One request per message: a marshal dict and its descriptors. An agent: two (the agent's end,
        its log). A spawn: four (stdin, stdout and stderr, then a socket on which the child's pid and
        pidfd go back)."""
        fd_size = ctypes.sizeof(ctypes.c_int)
        control.settimeout(REAP_EVERY_S)
        while True:
            self.reap()
            try:
                message, ancillary, _, _ = control.recvmsg(MAX_REQUEST, socket.CMSG_SPACE(4 * fd_size))
            except TimeoutError:
                continue
            if not message:
                return
            fds = [int.from_bytes(data[i : i + fd_size], sys.byteorder) for level, kind, data in ancillary
                   if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
                   for i in range(0, len(data) - len(data) % fd_size, fd_size)]  # fmt: skip
            try:
                if len(fds) == 2:
                    self.fork(control, marshal.loads(message), fds[0], fds[1])
                elif len(fds) == 4:
                    self.spawn(control, marshal.loads(message), fds)
            finally:
                for fd in fds:
                    os.close(fd)

    def spawn(self, control: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
        """Fork the sandbox's bubblewrap and answer with its pid and pidfd; a broker that gave up
        waiting (its end is closed) gets none, and the child is killed."""
        _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGCHLD})  # no reap before its pidfd is open
        try:
            pid = os.fork()
            if pid == 0:
                control.close()
                _signal.pthread_sigmask(_signal.SIG_UNBLOCK, {_signal.SIGCHLD})
                self.launch(request, fds)
            try:
                pidfd = os.pidfd_open(pid)  # the pid is still this child's: nothing reaps it meanwhile
                try:
                    with socket.socket(fileno=os.dup(fds[3])) as reply:
                        rights = pidfd.to_bytes(ctypes.sizeof(ctypes.c_int), sys.byteorder)
                        reply.sendmsg([str(pid).encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)])
                finally:
                    os.close(pidfd)
            except OSError:
                os.kill(pid, 9)
        finally:
            _signal.pthread_sigmask(_signal.SIG_UNBLOCK, {_signal.SIGCHLD})

    def reap(self) -> None:
        """Collect the children that ended, bubblewraps (the broker watches them by pidfd) and agents:
        one call per ended child, whatever the number alive. Run at each SIGCHLD and each request."""
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:  # no child at all
            pass


def main(control: socket.socket) -> None:
    """The zygote's entry, on its control socket (its stdin); it ends when the broker closes it. No
    garbage collection: its forks would copy every page it touched."""
    gc.disable()
    gc.freeze()
    zygote = Zygote()
    # its agents are its children: each is reaped as it ends (a sandbox's pid 1, ending, waits for
    # every process of its namespace to be reaped), not at the next request
    _signal.signal(_signal.SIGCHLD, lambda number, frame: zygote.reap())
    zygote.serve(control)
