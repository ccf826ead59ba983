"""The exec agents' zygote: one long-lived host process per broker with the exec agent's code
already loaded (``exec_agent.py``), which forks each local sandbox's agent into the namespaces that
bubblewrap made for it. A sandbox's agent then costs a fork, not a fresh interpreter.

Bubblewrap still sets each sandbox up, from the same command line as any of its commands
(``local_commands.sandbox_prefix``: the egress namespace, the uid, every namespace, the mounts, no
capabilities, no new privileges, no further user namespaces), with ``--as-pid-1`` and a stub as its
command (``agents.stub``): a shell that sets the sandbox's rlimits and reads a pipe that the broker
holds, the namespace's init (its signals are out of the sandbox's reach, and the agent's
``kill(-1)`` spares it). The broker hands the zygote the stub's host pid and the agent's end of a
socket pair (SCM_RIGHTS); the zygote moves the stub into the sandbox's cgroups and forks the agent
straight into the stub's pid namespace (it enters that namespace for its children only while it
forks, then goes back), and the child, still root on the host, joins the sandbox's cgroups, sets its
rlimits, makes a cgroup namespace of its own (rooted at those cgroups), enters the stub's ipc, uts,
net and mount namespaces and, last, its user namespace (bubblewrap's innermost one, which may make no
further user namespace), drops every capability (bounding, ambient, effective, permitted,
inheritable), takes the sandbox uid and gid with no supplementary groups, sets no-new-privileges and
serves: it starts a session of its own and becomes the subreaper of its commands (the stub reaps
nothing). The zygote is its parent and reaps it as it ends (SIGCHLD). One fork per agent: an
intermediate child, forked to enter the namespaces and fork the agent, cost a fork and an exit more.

The zygote also starts each sandbox's bubblewrap (a ``spawn`` request) with ``posix_spawn``: a
vfork, not a fork, so neither the zygote's memory is copied (and torn down again at the exec) nor any
Python runs in the child. What the child cannot do for itself there, the zygote does around the
call: it enters the egress and launch namespaces and takes the sandbox uid as its real uid and gid
(the child makes them its effective ones, ``POSIX_SPAWN_RESETIDS``, and the exec its saved ones),
then goes back to its own; what every bubblewrap needs the zygote has itself from its start (no
supplementary groups, an empty bounding set, no ambient or inheritable capabilities, no new
privileges: it execs nothing itself, and its agents drop the rest). So bubblewrap starts as the
sandbox uid with no groups, no capabilities and no new privileges, in a session of its own, with
every signal at its default (the two Python ignores restored by ``posix_spawn``, any its starter
ignored by the zygote at its start) and nothing open but its three descriptors (every descriptor
the zygote holds or receives is close-on-exec). The sandbox's cgroups and rlimits are not the
zygote's to take, not even for a moment (a kill of the sandbox's cgroups, its memory limit or its
spent CPU quota would reach the zygote and every sandbox with it; and it could not raise its own
hard limits back, no CAP_SYS_RESOURCE). Bubblewrap starts in the zygote's cgroups; the stub sets
its own rlimits (the shell's ``ulimit``, before it reports ready), and the zygote moves it into the
sandbox's cgroups before it forks the agent: until then nothing has run in the sandbox but the
stub's shell. The agent, which joins them itself, makes a cgroup namespace of its own rooted there
(the stub's, bubblewrap's, is rooted at the zygote's cgroups), so that its commands see their
cgroups as a bubblewrap of their own shows them. The broker gets bubblewrap's pidfd back (it is not
the broker's child: the zygote reaps it), so bubblewrap's ``--die-with-parent`` ties the sandbox to
the zygote, whose own end is the broker's.

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
import time

TYPE_CHECKING = False  # not ``typing``'s: the zygote loads no more than it needs (its forks copy it)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

if __name__ != "zygote":  # imported on the broker's side (names and checks); the zygote has them in its globals
    from services.sandbox_broker.backends.exec_agent import serve

# setns(2) flags, in the order the namespaces are entered: the user namespace last (from it, the
# others, which belong to its parent, could no longer be entered)
NAMESPACES = (("cgroup", 0x02000000), ("ipc", 0x08000000), ("uts", 0x04000000), ("net", 0x40000000),
              ("pid", 0x20000000), ("mnt", 0x00020000), ("user", 0x10000000))  # fmt: skip
PID_NAMESPACE = 0x20000000
CGROUP_NAMESPACE = 0x02000000
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
PR_SET_CHILD_SUBREAPER = 36
CAPABILITY_VERSION_3 = 0x20080522
RLIMITS = {
    "n": (resource.RLIMIT_NOFILE, 1),
    "f": (resource.RLIMIT_FSIZE, 512),
    "v": (resource.RLIMIT_AS, 1024),
    "c": (resource.RLIMIT_CORE, 512),
}  # ulimit's flags and units
MAX_REQUEST = 65_536
REAP_EVERY_S = 2.0  # with no request coming, ended bubblewraps are collected this often
STOP_POLLS, STOP_POLL_S = 200, 0.005  # how long a bubblewrap being killed is given to stop (1 s)


class Zygote:
    def __init__(self) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        with open("/proc/sys/kernel/cap_last_cap") as f:
            self.last_cap = int(f.read())
        self.own_pid_namespace = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        # where the zygote goes back to after a bubblewrap's start (the egress and launch namespaces)
        self.own = {flag: os.open(f"/proc/self/ns/{name}", os.O_RDONLY | os.O_CLOEXEC)
                    for name, flag in NAMESPACES if name in ("net", "mnt")}  # fmt: skip
        self.launched: set[int] = set()  # the bubblewraps it started that it has not reaped
        self.confine()

    def confine(self) -> None:
        """Take from the zygote what no bubblewrap it starts may have (they inherit it through
        ``posix_spawn``): supplementary groups, the bounding set, ambient and inheritable
        capabilities, new privileges. It execs nothing itself; its effective and permitted
        capabilities stay (the agents it forks need them until they drop them)."""
        os.setgroups([])
        self.drop_bounding()
        header, data = (ctypes.c_uint32 * 2)(CAPABILITY_VERSION_3, 0), (ctypes.c_uint32 * 6)()
        self.check(self.libc.capget(header, data), "capget")
        data[2] = data[5] = 0  # the inheritable words of the two 32-bit halves
        self.check(self.libc.capset(header, data), "capset")
        self.check(self.libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")

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
                  for name, flag in NAMESPACES if name not in ("pid", "cgroup")]  # fmt: skip
        os.setgroups([])  # before the user namespace: bubblewrap denies setgroups in it
        # a cgroup namespace of its own, rooted at the sandbox's cgroups it just joined (the stub's is
        # rooted where bubblewrap started, the zygote's): its commands see their cgroups as "/", as a
        # bubblewrap of their own shows them
        self.check(self.libc.unshare(CGROUP_NAMESPACE), "unshare(cgroup)")
        self.setns(opened)
        self.drop(int(request["uid"]))
        os.chdir(str(request["cwd"]))

    def join(self, request: dict[str, Any]) -> None:
        """Into the sandbox's cgroups, under its rlimits."""
        for path in request["procs"]:
            self.move(path)
        for flag, value in request["rlimits"].items():
            kind, unit = RLIMITS[flag]
            resource.setrlimit(kind, (value * unit, value * unit))

    def setns(self, opened: list[tuple[int, str, int]]) -> None:
        for fd, name, flag in opened:
            self.check(self.libc.setns(fd, flag), f"setns({name})")
            os.close(fd)

    def drop(self, uid: int) -> None:
        """Root to ``uid``: no capability in any set, no new privileges."""
        self.drop_bounding()
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        header, data = (ctypes.c_uint32 * 2)(CAPABILITY_VERSION_3, 0), (ctypes.c_uint32 * 6)()
        self.check(self.libc.capset(header, data), "capset")  # none left: effective, permitted, inheritable
        self.check(self.libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")

    def drop_bounding(self) -> None:
        """An empty bounding set and no ambient capabilities (both for good)."""
        for cap in range(self.last_cap + 1):
            self.check(self.libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "drop the capability bounding set")
        self.check(self.libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities")

    def launch(self, request: dict[str, Any], fds: list[int]) -> int:
        """Start the sandbox's bubblewrap (``fds``: its stdin, stdout, stderr) and return its pid:
        ``posix_spawn`` from the sandbox's namespaces with the sandbox uid as the real one, then the
        zygote's own namespaces and ids again (where it cannot get them back, it ends: it never serves
        on from a sandbox's). Bubblewrap starts in the zygote's cgroups: the stub is moved into the
        sandbox's before the agent is forked (``fork``)."""
        opened = [(os.open(path, os.O_RDONLY | os.O_CLOEXEC), path, flag) for path, flag in request["namespaces"]]
        uid, entered, argv = int(request["uid"]), [], list(request["argv"])
        try:
            for fd, name, flag in opened:
                self.check(self.libc.setns(fd, flag), f"setns({name})")
                entered.append(flag)
            os.setresgid(uid, 0, 0)
            os.setresuid(uid, 0, 0)  # still root in effect; the child takes the real ids as its effective ones
            return os.posix_spawn(
                argv[0], argv, dict(request["env"]), resetids=True, setsid=True, setsigmask=(),
                setsigdef=(_signal.SIGPIPE, _signal.SIGXFSZ),  # ignored here; restored, as Popen does
                file_actions=[(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(fds[:3])],
            )  # fmt: skip
        finally:
            try:
                os.setresuid(0, 0, 0)
                os.setresgid(0, 0, 0)
                for flag in reversed(entered):
                    self.check(self.libc.setns(self.own[flag], flag), "setns back")
                for fd, _, _ in opened:
                    os.close(fd)
            except BaseException:
                os._exit(70)

    def move(self, procs: str, pid: int = 0) -> None:
        """``pid`` (0: this process) into the cgroup of this ``cgroup.procs``."""
        with open(procs, "w") as f:
            f.write(str(pid or os.getpid()))

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
        the namespace's to kill. First the stub goes into the sandbox's cgroups (it started in the
        zygote's, and nothing but its shell has run in the sandbox yet). A stub that is gone fails this
        agent, not the zygote."""
        try:
            for path in request["procs"]:
                self.move(path, int(request["stub"]))
            target = os.open(f"/proc/{request['stub']}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
            try:
                self.check(self.libc.setns(target, PID_NAMESPACE), "setns(pid)")
            finally:
                os.close(target)
        except OSError as exc:
            self.report(log, f"the agent of {request.get('sandbox')} did not start: {exc!r}")
            return
        try:
            if os.fork() == 0:
                control.close()
                try:
                    _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)  # the zygote's handler is not the agent's
                    self.enter(request)
                    self.agent(channel, log)
                except BaseException as exc:
                    self.report(log, f"the agent of {request.get('sandbox')} did not start: {exc!r}")
                finally:
                    os._exit(0)
        finally:  # back, or never go on: the next bubblewrap would be born in this sandbox's namespace
            if self.libc.setns(self.own_pid_namespace, PID_NAMESPACE) != 0:
                os._exit(70)

    def report(self, log: int, message: str) -> None:
        """A line in the sandbox's agent log (best effort)."""
        try:
            os.write(log, f"zygote: {message}\n".encode())
        except OSError:
            pass

    def serve(self, control: socket.socket) -> None:
        """One request per message: a marshal dict and its descriptors. An agent: two (the agent's end,
        its log). A spawn: four (stdin, stdout and stderr, then a socket on which the child's pid and
        pidfd go back)."""
        fd_size = ctypes.sizeof(ctypes.c_int)
        control.settimeout(REAP_EVERY_S)
        while True:
            self.reap()
            try:
                message, ancillary, _, _ = control.recvmsg(
                    MAX_REQUEST, socket.CMSG_SPACE(4 * fd_size), socket.MSG_CMSG_CLOEXEC
                )  # none reaches a bubblewrap
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
        """Start the sandbox's bubblewrap and answer with its pid and pidfd; one that did not start
        (its error is in the sandbox's log) or a broker that gave up waiting (its end is closed)
        gets none, and a started one is killed with its child (``take``)."""
        _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGCHLD})  # no reap before its pidfd is open
        try:
            try:
                pid = self.launch(request, fds)
            except Exception as exc:
                self.report(fds[2], f"the sandbox {request.get('sandbox')} did not start: {exc!r}")
                return
            self.launched.add(pid)
            try:
                pidfd = os.pidfd_open(pid)  # the pid is still this child's: nothing reaps it meanwhile
                try:
                    with socket.socket(fileno=os.dup(fds[3])) as reply:
                        rights = pidfd.to_bytes(ctypes.sizeof(ctypes.c_int), sys.byteorder)
                        reply.sendmsg([str(pid).encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)])
                finally:
                    os.close(pidfd)
            except OSError:
                self.take(pid)
        finally:
            _signal.pthread_sigmask(_signal.SIG_UNBLOCK, {_signal.SIGCHLD})

    def reap(self) -> None:
        """Collect the children that ended, bubblewraps (the broker watches them by pidfd) and agents:
        one call per ended child, whatever the number alive. Run at each SIGCHLD and each request."""
        try:
            while pid := os.waitpid(-1, os.WNOHANG)[0]:
                self.launched.discard(pid)
        except ChildProcessError:  # no child at all
            pass

    def end(self) -> None:
        """At the zygote's end (its broker closed the control socket, or died): every bubblewrap it
        started goes, with its child (``take``)."""
        for pid in list(self.launched):  # a copy: SIGCHLD's reap may change the set
            self.take(pid)

    def take(self, pid: int) -> None:
        """Kill a bubblewrap this zygote started, and its child (``take``)."""
        take(pid, lambda signal: os.kill(pid, signal))


def take(pid: int, send: Callable[[int], None]) -> None:
    """Kill a bubblewrap and its child; ``send(signal)`` signals the bubblewrap (the zygote, its parent:
    ``kill``; the broker: its pidfd). Bubblewrap alone would not do: the child of one still setting up
    waits on an eventfd for its parent to write its uid map, before it has a parent-death signal of its
    own, and orphaned there it waited forever (pid 1 of an empty pid namespace, holding a copy of the
    launch namespace with the sandbox's mounts). It is stopped first, and its children are read once it
    is: a stop signal need not interrupt a clone already under way, so until then a child could still
    appear. A bubblewrap that ended meanwhile is left alone, and so are the children read of its pid."""
    try:
        send(_signal.SIGSTOP)
        for _ in range(STOP_POLLS):
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] in "TtZX":
                    break
            time.sleep(STOP_POLL_S)
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = [int(child) for child in f.read().split()]
        send(0)  # still the one stopped: its pid was not reused meanwhile
        for child in children:
            os.kill(child, _signal.SIGKILL)
        send(_signal.SIGKILL)
    except OSError:  # ended meanwhile
        pass


def restore_ignored_signals() -> None:
    """Every signal the zygote was started with ignored, except the two Python ignores itself, back
    to its default: a broker started under ``nohup`` (SIGHUP) or as a shell's background job (SIGINT,
    SIGQUIT) passed them on, and every bubblewrap, stub, agent and command of every sandbox inherited
    them (``posix_spawn`` and Popen restore SIGPIPE and SIGXFSZ only)."""
    for number in _signal.valid_signals():
        if number not in (_signal.SIGPIPE, _signal.SIGXFSZ) and _signal.getsignal(number) == _signal.SIG_IGN:
            _signal.signal(number, _signal.SIG_DFL)


def main(control: socket.socket) -> None:
    """The zygote's entry, on its control socket (its stdin); it ends when the broker closes it. No
    garbage collection: its forks would copy every page it touched."""
    gc.disable()
    gc.freeze()
    restore_ignored_signals()
    zygote = Zygote()
    # its agents are its children: each is reaped as it ends (a sandbox's pid 1, ending, waits for
    # every process of its namespace to be reaped), not at the next request
    _signal.signal(_signal.SIGCHLD, lambda number, frame: zygote.reap())
    try:
        zygote.serve(control)
    finally:
        zygote.end()
