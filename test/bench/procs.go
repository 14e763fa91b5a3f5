package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat: 100 on every Linux
// architecture the harness targets (the kernel exports a fixed USER_HZ regardless of HZ).
const clockTicks = 100

// child is a process started by the harness, in its own process group so that the group
// (nginx's workers included) can be signalled at once.
type child struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// children tracks every process the harness started, so that all are stopped on exit.
type children struct {
	mu   sync.Mutex
	list []*child
}

func (cs *children) start(name, logPath string, env []string, argv ...string) (*child, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	// If the harness dies without cleaning up (SIGKILL), the kernel signals the child. SIGTERM,
	// not SIGKILL: nginx's master then stops its workers, which no signal would reach
	// otherwise; Sluice and the simulator exit on SIGTERM too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		f.Close()
		close(c.done)
	}()
	cs.mu.Lock()
	cs.list = append(cs.list, c)
	cs.mu.Unlock()
	return c, nil
}

// stopAll stops every child: SIGTERM to its process group, SIGKILL after grace.
func (cs *children) stopAll(grace time.Duration) {
	cs.mu.Lock()
	list := cs.list
	cs.list = nil
	cs.mu.Unlock()
	for _, c := range list {
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGTERM)
	}
	deadline := time.After(grace)
	for _, c := range list {
		select {
		case <-c.done:
		case <-deadline:
		}
	}
	for _, c := range list {
		// The group may hold processes other than the leader (nginx workers): kill it
		// whether or not the leader has exited.
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-c.done:
		case <-time.After(2 * time.Second):
		}
	}
}

func (c *child) pid() int { return c.cmd.Process.Pid }

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// logTail returns the last lines of the child's log, for error messages.
func (c *child) logTail() string {
	b, _ := os.ReadFile(c.log)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return strings.Join(lines, "\n")
}

// waitHTTP polls url until it answers 200, the child exits, or timeout passes.
func waitHTTP(ctx context.Context, c *child, url string, timeout time.Duration) error {
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{Proxy: nil}}
	defer client.CloseIdleConnections()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if c != nil && c.exited() {
			return fmt.Errorf("%s exited (%v); its log:\n%s", c.name, c.err, c.logTail())
		}
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("status %s", resp.Status)
		}
		last = err
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	name := "target"
	tail := ""
	if c != nil {
		name, tail = c.name, "; its log:\n"+c.logTail()
	}
	return fmt.Errorf("%s not ready at %s after %v: %v%s", name, url, timeout, last, tail)
}

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// procStat is what the harness reads of one process from /proc.
type procStat struct {
	ticks      uint64 // utime + stime, in clock ticks
	sysTicks   uint64 // stime: in the kernel on the process's behalf
	childTicks uint64 // cutime + cstime: children waited for
	ppid       int
}

// parseStat parses /proc/PID/stat: fields after the command name, which is in parentheses
// and may itself contain spaces and parentheses.
func parseStat(b []byte) (procStat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, errors.New("malformed stat: no ')'")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); ppid is field 4, utime 14, stime 15, cutime 16, cstime 17.
	if len(f) < 15 {
		return procStat{}, errors.New("malformed stat: too few fields")
	}
	ppid, err1 := strconv.Atoi(f[1])
	ut, err2 := strconv.ParseUint(f[11], 10, 64)
	st, err3 := strconv.ParseUint(f[12], 10, 64)
	cut, err4 := strconv.ParseInt(f[13], 10, 64)
	cst, err5 := strconv.ParseInt(f[14], 10, 64)
	if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
		return procStat{}, fmt.Errorf("malformed stat: %w", err)
	}
	return procStat{ticks: ut + st, sysTicks: st, childTicks: uint64(max(cut, 0) + max(cst, 0)), ppid: ppid}, nil
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	return parseStat(b)
}

// parseVmHWM returns the VmHWM (peak resident set) of a /proc/PID/status, in bytes.
func parseVmHWM(b []byte) (int64, error) { return parseStatusKB(b, "VmHWM") }

// parseStatusKB returns a "Field:   N kB" line of a /proc/PID/status, in bytes.
func parseStatusKB(b []byte, field string) (int64, error) {
	for line := range strings.SplitSeq(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, field+":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("malformed %s line %q", field, line)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, err
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("no %s in status", field)
}

// readStatusKB reads a field of /proc/PID/status (parseStatusKB).
func readStatusKB(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return parseStatusKB(b, field)
}

// parseThreads returns the Threads count of a /proc/PID/status.
func parseThreads(b []byte) (int, error) {
	for line := range strings.SplitSeq(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, "Threads:")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(rest))
		if err != nil || n < 1 {
			return 0, fmt.Errorf("malformed Threads line %q", line)
		}
		return n, nil
	}
	return 0, errors.New("no Threads in status")
}

func readThreads(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return parseThreads(b)
}

// descendants returns root's pid and those of its children (one level: nginx's workers).
func descendants(root int) []int {
	pids := []int{root}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return pids
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == root {
			continue
		}
		if st, err := readStat(pid); err == nil && st.ppid == root {
			pids = append(pids, pid)
		}
	}
	return pids
}

// proxyProc is a measured proxy: its main process, and whether its children count too.
// /proc/PID/stat sums the CPU time of every thread of a process, and VmHWM is the whole
// process's, so a multi-threaded proxy in one process (Sluice; haproxy, run with -db: its
// nbthread threads) is measured whole by its pid alone.
type proxyProc struct {
	c        *child
	withKids bool // nginx: the master and its workers
}

func (p *proxyProc) pids() []int {
	if p.withKids {
		return descendants(p.c.pid())
	}
	return []int{p.c.pid()}
}

// cpuTicks is the CPU time (user + system) of the proxy's processes so far, in ticks.
func (p *proxyProc) cpuTicks() uint64 {
	all, _ := p.cpu()
	return all
}

// cpu is the CPU time (user + system) of the proxy's processes so far and the part of it in
// the kernel (system), in ticks.
func (p *proxyProc) cpu() (all, sys uint64) {
	for _, pid := range p.pids() {
		if st, err := readStat(pid); err == nil {
			all += st.ticks
			sys += st.sysTicks
		}
	}
	return all, sys
}

// rss returns the sum of VmHWM over the proxy's processes and each one's figure.
func (p *proxyProc) rss() (sum int64, each []int64) {
	for _, pid := range p.pids() {
		if v, err := readStatusKB(pid, "VmHWM"); err == nil {
			sum += v
			each = append(each, v)
		}
	}
	return sum, each
}

// resident returns the sum of VmRSS (the resident set now) over the proxy's processes.
func (p *proxyProc) resident() int64 {
	var sum int64
	for _, pid := range p.pids() {
		if v, err := readStatusKB(pid, "VmRSS"); err == nil {
			sum += v
		}
	}
	return sum
}

// lookTool finds a tool on PATH or in the sbin directories a non-login root shell may lack.
func lookTool(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/local/sbin", "/usr/bin", "/usr/local/bin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// parseMachineBusy returns the time all CPUs spent running processes (user, nice, system;
// guest time is inside user) from /proc/stat, in clock ticks. Interrupt and softirq time are
// left out: loopback networking is mostly softirq time that is charged to no process, so
// it would count the harness's own traffic as other work.
func parseMachineBusy(b []byte) (uint64, error) {
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, errors.New("malformed /proc/stat")
	}
	var busy uint64
	for _, i := range []int{1, 2, 3} { // user nice system
		v, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("malformed /proc/stat: %w", err)
		}
		busy += v
	}
	return busy, nil
}

// meter tells, for one turn, the CPU a proxy used and how busy the machine was with work
// that is not the harness's: the harness itself (vegeta, the stream client, and wrk once
// waited for) and the processes it started.
type meter struct {
	procs []*proxyProc // the simulator and every proxy the harness started
}

// theMeter is set once the children run; nil-safe.
var theMeter *meter

type sample struct {
	at              time.Time
	machine, ours   uint64
	proxy, proxySys uint64
	proxyP          *proxyProc
	machineReadable bool
}

func (m *meter) ours() uint64 {
	var sum uint64
	if st, err := readStat(os.Getpid()); err == nil {
		sum += st.ticks + st.childTicks
	}
	if m != nil {
		for _, p := range m.procs {
			sum += p.cpuTicks()
		}
	}
	return sum
}

// start samples before a turn against p (nil for direct).
func (m *meter) start(p *proxyProc) sample {
	s := sample{at: time.Now(), proxyP: p}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		s.machine, err = parseMachineBusy(b)
		s.machineReadable = err == nil
	}
	s.ours = m.ours()
	if p != nil {
		s.proxy, s.proxySys = p.cpu()
	}
	return s
}

// stop returns the proxy's CPU ticks since s and the CPUs' worth of foreign work.
func (m *meter) stop(s sample) (proxyTicks uint64, foreign float64) {
	proxyTicks, _, foreign = m.stopSplit(s)
	return proxyTicks, foreign
}

// stopSplit is stop with the part of the proxy's ticks spent in the kernel.
func (m *meter) stopSplit(s sample) (proxyTicks, proxySys uint64, foreign float64) {
	e := m.start(s.proxyP)
	if s.proxyP != nil {
		proxyTicks, proxySys = e.proxy-s.proxy, e.proxySys-s.proxySys
	}
	wall := e.at.Sub(s.at).Seconds()
	if s.machineReadable && e.machineReadable && wall > 0 {
		other := float64(e.machine-s.machine) - float64(e.ours-s.ours)
		foreign = max(0, other/clockTicks/wall)
	}
	return proxyTicks, proxySys, foreign
}

// readRest reads each proxy at rest: its resident memory and, for Sluice, the goroutines
// its admin listener's /metrics counts.
func (res *results) readRest(ctx context.Context, adminAddr string) map[string]restInfo {
	m := map[string]restInfo{}
	for _, t := range res.targets {
		if t.proxy == nil {
			continue
		}
		ri := restInfo{rss: t.proxy.resident(), goroutines: -1}
		if t.name == "sluice" {
			ri.goroutines = goroutines(ctx, "http://"+adminAddr+"/metrics")
		}
		m[t.name] = ri
	}
	return m
}

// goroutines is the go_goroutines gauge of a Prometheus exposition at url; -1 when it
// cannot be read.
func goroutines(ctx context.Context, url string) int {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return -1
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	return parseGoroutines(io.LimitReader(resp.Body, 16<<20))
}

// parseGoroutines finds the go_goroutines sample of an exposition; -1 without one.
func parseGoroutines(r io.Reader) int {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
			if v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64); err == nil && v >= 0 && v < 1e9 {
				return int(v)
			}
		}
	}
	return -1
}
