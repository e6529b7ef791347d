//! What carries an SSH session's bytes: a pump thread between the socket the
//! session reads (one end of a Unix socket pair, which ssh2 takes like a TCP
//! stream) and the real carrier: a TCP connection, a `ProxyCommand`'s
//! stdin/stdout, or a `direct-tcpip` channel of a bastion's session.
//!
//! Why every session goes through a pump, even a direct one: the pump sees
//! when the server last sent anything, which is what `ServerAliveCountMax`
//! needs (ssh2 sends keepalives but never says whether they were answered).
//! [`Health::kill`] ends the pump, so the session's next read fails at once
//! and the transport reconnects instead of waiting for a TCP timeout.

use std::io::{self, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::hops::Keepalive;

/// Shared between a pump and whoever sends keepalives over its session.
#[derive(Debug, Default)]
pub struct Health {
    /// Keepalives sent since the server last sent a byte.
    unanswered: AtomicU32,
    killed: AtomicBool,
}

impl Health {
    pub fn kill(&self) {
        self.killed.store(true, Ordering::SeqCst);
    }
    pub fn killed(&self) -> bool {
        self.killed.load(Ordering::SeqCst)
    }
    pub fn unanswered(&self) -> u32 {
        self.unanswered.load(Ordering::SeqCst)
    }
    pub fn keepalive_sent(&self) {
        self.unanswered.fetch_add(1, Ordering::SeqCst);
    }
    /// The server sent something: every keepalive so far is answered.
    fn answered(&self) {
        self.unanswered.store(0, Ordering::SeqCst);
    }

    /// One keepalive tick: `false` (and the link killed) when `count_max`
    /// keepalives went unanswered, as OpenSSH's ServerAliveCountMax.
    pub fn may_send_keepalive(&self, ka: Keepalive) -> bool {
        if self.unanswered() >= ka.count_max.max(1) {
            self.kill();
            return false;
        }
        true
    }
}

/// A carrier, pumped by a thread; `stream` goes to `Session::set_tcp_stream`.
pub struct Link {
    pub stream: UnixStream,
    pub health: Arc<Health>,
    /// A ProxyCommand's last lines on stderr, for error messages.
    stderr: Option<Arc<Mutex<Vec<u8>>>>,
}

impl Link {
    /// A connected TCP socket.
    pub fn tcp(tcp: TcpStream) -> io::Result<Link> {
        let _ = tcp.set_nodelay(true);
        Self::spawn(Box::new(SocketUp { fd: tcp.as_raw_fd(), _owner: Owner::Tcp(tcp), child: None }), None)
    }

    /// `sh -c 'exec COMMAND'` with its stdin and stdout on a socket pair (the
    /// command is the user's own ssh config, as OpenSSH runs it).
    pub fn command(command: &str) -> io::Result<Link> {
        let (ours, theirs) = UnixStream::pair()?;
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!("exec {command}"))
            .stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs.try_clone()?)))
            .stdout(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
            .stderr(Stdio::piped())
            .spawn()?;
        let tail = Arc::new(Mutex::new(Vec::new()));
        if let Some(mut err) = child.stderr.take() {
            let tail = tail.clone();
            std::thread::Builder::new().name("ssh-proxy-stderr".into()).spawn(move || {
                let mut buf = [0u8; 1024];
                while let Ok(n) = err.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
                    t.extend_from_slice(&buf[..n]);
                    let excess = t.len().saturating_sub(2048);
                    t.drain(..excess);
                }
            })?;
        }
        Self::spawn(
            Box::new(SocketUp { fd: ours.as_raw_fd(), _owner: Owner::Unix(ours), child: Some(child) }),
            Some(tail),
        )
    }

    /// A `direct-tcpip` channel of `session` (a bastion's, whose own link is
    /// `session_fd`/`session_health`); the pump owns both from now on and
    /// sends the bastion's keepalives.
    pub fn channel(
        session: ssh2::Session,
        channel: ssh2::Channel,
        session_fd: RawFd,
        session_health: Arc<Health>,
        keepalive: Keepalive,
    ) -> io::Result<Link> {
        session.set_blocking(false);
        let next_keepalive = Instant::now() + Duration::from_secs(u64::from(keepalive.interval));
        Self::spawn(
            Box::new(ChannelUp { channel, session, fd: session_fd, health: session_health, keepalive, next_keepalive }),
            None,
        )
    }

    fn spawn(up: Box<dyn Upstream>, stderr: Option<Arc<Mutex<Vec<u8>>>>) -> io::Result<Link> {
        let (session_side, pump_side) = UnixStream::pair()?;
        let health = Arc::new(Health::default());
        let h = health.clone();
        std::thread::Builder::new().name("ssh-link".into()).spawn(move || pump(pump_side, up, &h))?;
        Ok(Link { stream: session_side, health, stderr })
    }

    /// What a ProxyCommand printed on stderr (waits briefly for it to finish).
    pub fn stderr_tail(&self) -> Option<String> {
        let tail = self.stderr.as_ref()?;
        std::thread::sleep(Duration::from_millis(100));
        let t = tail.lock().unwrap_or_else(|p| p.into_inner());
        let s = String::from_utf8_lossy(&t).trim().to_string();
        (!s.is_empty()).then_some(s)
    }
}

/// The far side of a pump.
trait Upstream: Send {
    /// `WouldBlock` when nothing is there yet; `Ok(0)` at end of stream.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    fn write(&mut self, buf: &[u8]) -> io::Result<usize>;
    fn shutdown_write(&mut self) -> io::Result<()>;
    /// What to wait on when nothing moved (`blocked_write`: output is pending).
    fn pollfd(&self, blocked_write: bool) -> libc::pollfd;
    /// Periodic work (keepalives); `false`: the carrier is dead.
    fn tick(&mut self) -> bool {
        true
    }
    /// How long to wait while output is pending: short where a library may
    /// hold data the socket no longer shows (libssh2 reads while it writes).
    fn pending_wait_ms(&self) -> i32 {
        500
    }
}

enum Owner {
    Tcp(#[allow(dead_code)] TcpStream),
    Unix(#[allow(dead_code)] UnixStream),
}

/// A socket: TCP, or the pair end a ProxyCommand holds the other end of.
struct SocketUp {
    fd: RawFd,
    _owner: Owner,
    child: Option<Child>,
}

impl Upstream for SocketUp {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        sock_read(self.fd, buf)
    }
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        sock_write(self.fd, buf)
    }
    fn shutdown_write(&mut self) -> io::Result<()> {
        // SAFETY: fd is owned by `_owner` for as long as self lives.
        if unsafe { libc::shutdown(self.fd, libc::SHUT_WR) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
    fn pollfd(&self, blocked_write: bool) -> libc::pollfd {
        libc::pollfd { fd: self.fd, events: libc::POLLIN | if blocked_write { libc::POLLOUT } else { 0 }, revents: 0 }
    }
}

impl Drop for SocketUp {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A bastion's `direct-tcpip` channel, its session non-blocking.
struct ChannelUp {
    channel: ssh2::Channel,
    session: ssh2::Session,
    fd: RawFd,
    health: Arc<Health>,
    keepalive: Keepalive,
    next_keepalive: Instant,
}

impl Upstream for ChannelUp {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.channel.read(buf) {
            // libssh2 may return 0 without data and without EOF.
            Ok(0) if !self.channel.eof() => Err(ErrorKind::WouldBlock.into()),
            r => r,
        }
    }
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.channel.write(buf)
    }
    fn shutdown_write(&mut self) -> io::Result<()> {
        self.channel.send_eof().map_err(io::Error::from)
    }
    fn pollfd(&self, blocked_write: bool) -> libc::pollfd {
        let outbound = blocked_write
            && matches!(self.session.block_directions(), ssh2::BlockDirections::Outbound | ssh2::BlockDirections::Both);
        libc::pollfd { fd: self.fd, events: libc::POLLIN | if outbound { libc::POLLOUT } else { 0 }, revents: 0 }
    }
    fn pending_wait_ms(&self) -> i32 {
        20
    }
    fn tick(&mut self) -> bool {
        if self.health.killed() {
            return false;
        }
        if self.keepalive.interval == 0 || Instant::now() < self.next_keepalive {
            return true;
        }
        self.next_keepalive = Instant::now() + Duration::from_secs(u64::from(self.keepalive.interval));
        if !self.health.may_send_keepalive(self.keepalive) {
            tracing::warn!(
                "bastion did not answer {} keepalives; closing the connection through it",
                self.keepalive.count_max
            );
            return false;
        }
        // A keepalive while a channel write is half sent is refused by libssh2: skip it then.
        if self.session.keepalive_send().is_ok() {
            self.health.keepalive_sent();
        }
        true
    }
}

impl Drop for ChannelUp {
    fn drop(&mut self) {
        let _ = self.channel.close();
    }
}

/// Moves bytes both ways until either side ends or the link is killed.
fn pump(ours: UnixStream, up: Box<dyn Upstream>, health: &Health) {
    let mut p = Pump {
        fd: ours.as_raw_fd(),
        up,
        down: Buf::default(),
        upb: Buf::default(),
        up_eof: false,
        ours_eof_at: None,
        up_shut: false,
    };
    loop {
        if health.killed() || !p.up.tick() {
            break;
        }
        let Flow::Open(down_moved) = p.carrier_to_session(health) else { break };
        let Flow::Open(up_moved) = p.session_to_carrier() else { break };
        // The session closed its side: give the server a moment to say goodbye.
        if p.ours_eof_at.is_some_and(|t| t.elapsed() > Duration::from_secs(2)) {
            break;
        }
        if !(down_moved || up_moved) {
            p.wait();
        }
    }
    // Dropping `up` closes the carrier (and kills a ProxyCommand); dropping
    // `ours` makes the session's next read fail.
    drop(p);
    let _ = ours.shutdown(std::net::Shutdown::Both);
}

/// What one pass of a direction left: still open (whether bytes moved), or ended.
enum Flow {
    Open(bool),
    Ended,
}

/// The two directions of a link: carrier → session (`down`) and session →
/// carrier (`upb`), each through its own buffer.
struct Pump {
    fd: RawFd,
    up: Box<dyn Upstream>,
    down: Buf,
    upb: Buf,
    up_eof: bool,
    /// When the session's side reached end of file.
    ours_eof_at: Option<Instant>,
    up_shut: bool,
}

impl Pump {
    fn ours_eof(&self) -> bool {
        self.ours_eof_at.is_some()
    }

    /// Read from the carrier when its buffer is drained, write to the session;
    /// ended when the session is gone or the carrier ended and all is written.
    fn carrier_to_session(&mut self, health: &Health) -> Flow {
        let mut moved = false;
        if self.down.is_empty() && !self.up_eof {
            match self.up.read(self.down.space()) {
                Ok(0) => self.up_eof = true,
                Ok(n) => {
                    self.down.filled(n);
                    health.answered();
                    moved = true;
                }
                Err(e) if retry(&e) => {}
                Err(_) => self.up_eof = true,
            }
        }
        if !self.down.is_empty() {
            match sock_write(self.fd, self.down.data()) {
                Ok(n) => {
                    self.down.consume(n);
                    moved = true;
                }
                Err(e) if retry(&e) => {}
                Err(_) => return Flow::Ended, // the session is gone
            }
        }
        if self.up_eof && self.down.is_empty() {
            return Flow::Ended;
        }
        Flow::Open(moved)
    }

    /// Read from the session when its buffer is drained, write to the carrier,
    /// and pass the session's end of file on once all is written.
    fn session_to_carrier(&mut self) -> Flow {
        let mut moved = false;
        if self.upb.is_empty() && !self.ours_eof() {
            match sock_read(self.fd, self.upb.space()) {
                Ok(0) => self.ours_eof_at = Some(Instant::now()),
                Ok(n) => {
                    self.upb.filled(n);
                    moved = true;
                }
                Err(e) if retry(&e) => {}
                Err(_) => return Flow::Ended,
            }
        }
        if !self.upb.is_empty() {
            match self.up.write(self.upb.data()) {
                Ok(n) => {
                    self.upb.consume(n);
                    moved = true;
                }
                Err(e) if retry(&e) => {}
                Err(_) => return Flow::Ended,
            }
        }
        if self.ours_eof() && self.upb.is_empty() && !self.up_shut {
            match self.up.shutdown_write() {
                Ok(()) => self.up_shut = true,
                Err(e) if retry(&e) => {}
                Err(_) => return Flow::Ended,
            }
        }
        Flow::Open(moved)
    }

    /// Nothing moved: wait for either side, bounded for keepalive ticks and a kill.
    fn wait(&self) {
        let mut ev = 0;
        if !self.down.is_empty() {
            ev |= libc::POLLOUT;
        }
        if self.upb.is_empty() && !self.ours_eof() {
            ev |= libc::POLLIN;
        }
        let mut fds = [libc::pollfd { fd: self.fd, events: ev, revents: 0 }, self.up.pollfd(!self.upb.is_empty())];
        let timeout = if self.upb.is_empty() { 500 } else { self.up.pending_wait_ms() };
        // SAFETY: fds is a valid array of two pollfd structs.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
    }
}

fn retry(e: &io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted)
}

fn sock_read(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: buf is valid for writes of its length.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// MSG_NOSIGNAL: a closed peer is an error, never a SIGPIPE.
fn sock_write(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: buf is valid for reads of its length.
    let n = unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

struct Buf {
    data: Box<[u8]>,
    start: usize,
    end: usize,
}

impl Default for Buf {
    fn default() -> Self {
        Buf { data: vec![0; 64 * 1024].into_boxed_slice(), start: 0, end: 0 }
    }
}

impl Buf {
    fn is_empty(&self) -> bool {
        self.start == self.end
    }
    fn space(&mut self) -> &mut [u8] {
        self.start = 0;
        self.end = 0;
        &mut self.data[..]
    }
    fn filled(&mut self, n: usize) {
        self.end = n;
    }
    fn data(&self) -> &[u8] {
        &self.data[self.start..self.end]
    }
    fn consume(&mut self, n: usize) {
        self.start += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn round_trip(link: &Link) {
        let mut s = link.stream.try_clone().expect("clone");
        s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        // More than one buffer's worth, both ways at once.
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let mut w = s.try_clone().expect("clone");
        let sent = data.clone();
        let writer = std::thread::spawn(move || w.write_all(&sent));
        let mut got = vec![0u8; data.len()];
        s.read_exact(&mut got).expect("echoed back");
        writer.join().expect("joined").expect("written");
        assert!(got == data, "bytes intact");
    }

    #[test]
    fn tcp_link_carries_bytes_both_ways_and_ends_when_killed() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        std::thread::spawn(move || {
            let (mut c, _) = l.accept().expect("accept");
            let mut r = c.try_clone().expect("clone");
            let _ = std::io::copy(&mut r, &mut c);
        });
        let link = Link::tcp(TcpStream::connect(addr).expect("connect")).expect("link");
        round_trip(&link);
        link.health.kill();
        let mut s = link.stream.try_clone().expect("clone");
        s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        let mut b = [0u8; 1];
        assert_eq!(s.read(&mut b).expect("EOF, not a timeout"), 0, "a killed link reads as closed");
    }

    #[test]
    fn command_link_runs_the_command_on_a_socket_pair() {
        let link = Link::command("sh -c 'cat; echo gone >&2'").expect("spawn");
        round_trip(&link);
        link.stream.shutdown(std::net::Shutdown::Write).expect("shutdown");
        let mut s = link.stream.try_clone().expect("clone");
        s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).expect("EOF after the command exits");
        assert!(rest.is_empty());
        assert_eq!(link.stderr_tail().as_deref(), Some("gone"));
    }

    #[test]
    fn keepalives_unanswered_count_max_times_kill_the_link() {
        let h = Health::default();
        let ka = Keepalive { interval: 1, count_max: 2 };
        assert!(h.may_send_keepalive(ka));
        h.keepalive_sent();
        h.answered();
        assert!(h.may_send_keepalive(ka));
        h.keepalive_sent();
        assert!(h.may_send_keepalive(ka));
        h.keepalive_sent();
        assert!(!h.may_send_keepalive(ka), "two unanswered");
        assert!(h.killed());
    }
}
