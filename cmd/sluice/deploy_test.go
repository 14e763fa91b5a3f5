package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/xds"
)

// The pods of the deploy manifests as far as these checks read them (the manifests' own
// test, deploy/manifests, decodes them strictly into the Kubernetes API types).
type (
	k8sDoc struct {
		Kind     string `yaml:"kind"`
		Metadata struct {
			Name string `yaml:"name"`
		} `yaml:"metadata"`
		Data map[string]string `yaml:"data"`
		Spec struct {
			Ports []struct {
				Port int `yaml:"port"`
			} `yaml:"ports"`
			Template struct {
				Spec podSpec `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	podSpec struct {
		TerminationGracePeriodSeconds *int64          `yaml:"terminationGracePeriodSeconds"`
		InitContainers                []podContainer  `yaml:"initContainers"`
		Containers                    []podContainer  `yaml:"containers"`
		Volumes                       []podVolumeSpec `yaml:"volumes"`
	}
	podContainer struct {
		Name          string   `yaml:"name"`
		Image         string   `yaml:"image"`
		Command       []string `yaml:"command"`
		Args          []string `yaml:"args"`
		RestartPolicy string   `yaml:"restartPolicy"`
		Env           []struct {
			Name      string     `yaml:"name"`
			Value     string     `yaml:"value"`
			ValueFrom *yaml.Node `yaml:"valueFrom"`
		} `yaml:"env"`
		Ports []struct {
			Name          string `yaml:"name"`
			ContainerPort int    `yaml:"containerPort"`
		} `yaml:"ports"`
		VolumeMounts []struct {
			Name      string `yaml:"name"`
			MountPath string `yaml:"mountPath"`
			ReadOnly  bool   `yaml:"readOnly"`
			SubPath   string `yaml:"subPath"`
		} `yaml:"volumeMounts"`
		Lifecycle *struct {
			PreStop *struct {
				Sleep *struct {
					Seconds int64 `yaml:"seconds"`
				} `yaml:"sleep"`
			} `yaml:"preStop"`
		} `yaml:"lifecycle"`
	}
	podVolumeSpec struct {
		Name      string `yaml:"name"`
		ConfigMap *struct {
			Name  string `yaml:"name"`
			Items []struct {
				Key  string `yaml:"key"`
				Path string `yaml:"path"`
			} `yaml:"items"`
		} `yaml:"configMap"`
		Secret *struct {
			SecretName string `yaml:"secretName"`
		} `yaml:"secret"`
		EmptyDir              *yaml.Node `yaml:"emptyDir"`
		Ephemeral             *yaml.Node `yaml:"ephemeral"`
		PersistentVolumeClaim *yaml.Node `yaml:"persistentVolumeClaim"`
	}
)

// sluiceImage matches the images of Sluice (the static build and the NVML one).
var sluiceImage = regexp.MustCompile(`(^|/)sluice(-gpu)?(:|@|$)`)

// drainMargin is what terminationGracePeriodSeconds must leave beyond the drain.
const drainMargin = 5 * time.Second

// TestDeployManifests: every Sluice container of the deploy manifests passes flags its
// subcommand has, names files that its pod mounts, and runs a config that `sluice check`
// accepts in the environment the pod gives it (the fleet's config as `sluice xds` loads it,
// a replica's bootstrap as `sluice serve --xds` takes it); each pod's grace period covers the
// drain of the config it runs (in a sidecar pod, after the model server's preStop sleep). The
// broken fixtures show each of these checks failing.
func TestDeployManifests(t *testing.T) {
	const fixtures = "../../deploy/manifests/testdata/"
	tests := []struct {
		file string
		want string // a problem must contain it; "" for none
	}{
		{"../../deploy/rendered/sidecar.yaml", ""},
		{"../../deploy/rendered/edge.yaml", ""},
		{"../../deploy/rendered/mesh.yaml", ""},
		{fixtures + "good.yaml", ""},
		{fixtures + "sluice-broken-flag.yaml", "container gw: serve: flag provided but not defined: -xds-persit"},
		{fixtures + "sluice-broken-argument.yaml", `container gw: serve: unexpected arguments ["/etc/sluice/config/sluice.yaml"]`},
		{fixtures + "sluice-broken-mount.yaml", "container gw: --config /etc/sluice/sluice.yaml: not a file of any volume the container mounts"},
		{fixtures + "sluice-broken-config.yaml", `clusters[0].health_check.pth: unknown key (did you mean "path"?)`},
		{fixtures + "sluice-broken-token.yaml", "admin.listen: \"0.0.0.0:9090\" is not a loopback address, so a bearer token is required: set SLUICE_ADMIN_TOKEN"},
		{fixtures + "sluice-broken-grace.yaml", "terminationGracePeriodSeconds 40 is less than the model server's preStop sleep (35s) + drain_delay (5s) + drain_timeout (30s) + 5s"},
		{fixtures + "sluice-broken-prestop.yaml", "container model: preStop sleep 10s is shorter than drain_delay (5s) + drain_timeout (30s)"},
		{fixtures + "sluice-broken-readiness.yaml", "container gw: a native sidecar without admin.ready_clusters"},
	}
	for _, tt := range tests {
		t.Run(filepath.Base(tt.file), func(t *testing.T) {
			data, err := os.ReadFile(tt.file)
			if err != nil {
				t.Fatal(err)
			}
			got, err := checkDeploy(t, data)
			if err != nil {
				t.Fatal(err)
			}
			if tt.want == "" {
				for _, p := range got {
					t.Error(p)
				}
				return
			}
			if !strings.Contains(strings.Join(got, "\n"), tt.want) {
				t.Errorf("problems %q\nlack %q", got, tt.want)
			}
		})
	}
}

// manifests are the documents of one file that the checks look up.
type manifests struct {
	configMaps map[string]map[string]string
	services   map[string][]int
	pods       []namedPod
}

type namedPod struct {
	name string
	spec podSpec
}

func readManifests(data []byte) (*manifests, error) {
	m := &manifests{configMaps: map[string]map[string]string{}, services: map[string][]int{}}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var d k8sDoc
		err := dec.Decode(&d)
		if errors.Is(err, io.EOF) {
			return m, nil
		}
		if err != nil {
			return nil, fmt.Errorf("decode: %w", err)
		}
		switch d.Kind {
		case "ConfigMap":
			m.configMaps[d.Metadata.Name] = d.Data
		case "Service":
			for _, p := range d.Spec.Ports {
				m.services[d.Metadata.Name] = append(m.services[d.Metadata.Name], p.Port)
			}
		case "Deployment", "StatefulSet", "DaemonSet", "Job":
			m.pods = append(m.pods, namedPod{d.Kind + " " + d.Metadata.Name, d.Spec.Template.Spec})
		}
	}
}

// checkDeploy checks every Sluice container of a manifest file (see TestDeployManifests) and
// returns the problems found.
func checkDeploy(t *testing.T, data []byte) ([]string, error) {
	m, err := readManifests(data)
	if err != nil {
		return nil, err
	}
	var problems []string
	// The control planes first: a replica's drain comes from the fleet's config they serve.
	fleets := map[string]*config.Config{}
	for _, pod := range m.pods {
		for _, c := range pod.spec.Containers {
			if sluiceImage.MatchString(c.Image) && len(c.Args) > 0 && c.Args[0] == "xds" {
				pc := newPodCheck(t, m, pod, c)
				if cfg := pc.checkXDS(); cfg != nil {
					for _, svc := range pc.servicesOf() {
						fleets[svc] = cfg
					}
				}
				problems = append(problems, pc.problems...)
			}
		}
	}
	for _, pod := range m.pods {
		for i, c := range append(append([]podContainer(nil), pod.spec.InitContainers...), pod.spec.Containers...) {
			if !sluiceImage.MatchString(c.Image) || len(c.Args) > 0 && c.Args[0] == "xds" {
				continue
			}
			pc := newPodCheck(t, m, pod, c)
			pc.nativeSidecar = i < len(pod.spec.InitContainers) && c.RestartPolicy == "Always"
			pc.checkServe(fleets)
			problems = append(problems, pc.problems...)
		}
	}
	return problems, nil
}

// podCheck checks one Sluice container in a copy of its pod's file system: the files of the
// volumes it mounts, under a temporary root.
type podCheck struct {
	t             *testing.T
	m             *manifests
	pod           namedPod
	c             podContainer
	root          string
	nativeSidecar bool
	problems      []string
}

func newPodCheck(t *testing.T, m *manifests, pod namedPod, c podContainer) *podCheck {
	return &podCheck{t: t, m: m, pod: pod, c: c, root: t.TempDir()}
}

func (pc *podCheck) addf(format string, args ...any) {
	pc.problems = append(pc.problems, fmt.Sprintf("%s: container %s: ", pc.pod.name, pc.c.Name)+fmt.Sprintf(format, args...))
}

// mount is one volume mount of the container, as the checks need it.
type mount struct {
	path     string
	writable bool // a writable volume (emptyDir, ephemeral, claim) mounted read-write
}

// materialize writes the container's mounts under root: ConfigMap keys as files, a Secret the
// user makes as a TLS pair (tls.crt, tls.key: the only Secret volumes of the manifests), the
// other volumes as empty folders. It returns the mounts, longest path first.
func (pc *podCheck) materialize() []mount {
	volumes := map[string]podVolumeSpec{}
	for _, v := range pc.pod.spec.Volumes {
		volumes[v.Name] = v
	}
	var ms []mount
	for _, vm := range pc.c.VolumeMounts {
		v, ok := volumes[vm.Name]
		if !ok {
			pc.addf("volumeMount %s: no such volume", vm.Name)
			continue
		}
		dir := filepath.Join(pc.root, vm.MountPath)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			pc.t.Fatal(err)
		}
		m := mount{path: vm.MountPath}
		switch {
		case v.ConfigMap != nil:
			data, ok := pc.m.configMaps[v.ConfigMap.Name]
			if !ok {
				pc.addf("volume %s: ConfigMap %s is not in the manifests", v.Name, v.ConfigMap.Name)
			}
			files := map[string]string{}
			for k, val := range data {
				files[k] = val
			}
			if len(v.ConfigMap.Items) > 0 {
				files = map[string]string{}
				for _, it := range v.ConfigMap.Items {
					files[it.Path] = data[it.Key]
				}
			}
			for name, content := range files {
				pc.write(filepath.Join(dir, name), content)
			}
		case v.Secret != nil:
			cert, key := selfSigned(pc.t)
			pc.write(filepath.Join(dir, "tls.crt"), cert)
			pc.write(filepath.Join(dir, "tls.key"), key)
		case v.EmptyDir != nil, v.Ephemeral != nil, v.PersistentVolumeClaim != nil:
			m.writable = !vm.ReadOnly
		default:
			pc.addf("volume %s: a kind of volume this test does not know", v.Name)
		}
		ms = append(ms, m)
	}
	sort.Slice(ms, func(i, j int) bool { return len(ms[i].path) > len(ms[j].path) })
	return ms
}

func (pc *podCheck) write(file, content string) {
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		pc.t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
		pc.t.Fatal(err)
	}
}

// local maps a path in the pod to the copy under root, when a mount holds it.
func (pc *podCheck) local(ms []mount, p string) (string, *mount, bool) {
	for i, m := range ms {
		if p == m.path || strings.HasPrefix(p, m.path+"/") {
			return filepath.Join(pc.root, p), &ms[i], true
		}
	}
	return p, nil, false
}

// mountedFile checks that a file a flag names is a file of a mounted volume, and returns its
// copy.
func (pc *podCheck) mountedFile(ms []mount, flagName, p string) (string, bool) {
	lp, _, ok := pc.local(ms, p)
	if fi, err := os.Stat(lp); !ok || err != nil || fi.IsDir() {
		pc.addf("--%s %s: not a file of any volume the container mounts", flagName, p)
		return "", false
	}
	return lp, true
}

// writableDir checks that a file the container writes is in a writable mounted volume.
func (pc *podCheck) writableDir(ms []mount, what, p string) {
	if _, m, ok := pc.local(ms, path.Dir(p)); !ok || !m.writable {
		pc.addf("%s %s: its folder is not on a writable volume the container mounts", what, p)
	}
}

// rewrite moves every string of a config or bootstrap file that names a path in a mount to
// the mount's copy, writes the file back, and returns the environment variables the file
// names (the values of its *_env keys).
func (pc *podCheck) rewrite(ms []mount, file string) []string {
	data, err := os.ReadFile(file)
	if err != nil {
		pc.t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil // sluice check reports it
	}
	var names []string
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		for i, c := range n.Content {
			if n.Kind == yaml.MappingNode && i%2 == 0 {
				continue // a key
			}
			if n.Kind == yaml.MappingNode && strings.HasSuffix(n.Content[i-1].Value, "_env") && c.Kind == yaml.ScalarNode {
				names = append(names, c.Value)
			}
			if c.Kind == yaml.ScalarNode && strings.HasPrefix(c.Value, "/") {
				if lp, _, ok := pc.local(ms, c.Value); ok {
					c.Value = lp
				}
			}
			walk(c)
		}
	}
	walk(&doc)
	out, err := yaml.Marshal(&doc)
	if err != nil {
		pc.t.Fatal(err)
	}
	pc.write(file, string(out))
	return names
}

// podEnv is the container's environment as the kubelet makes it (a Secret's key as a token,
// a field as a placeholder).
func (pc *podCheck) podEnv() map[string]string {
	env := map[string]string{}
	for _, e := range pc.c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = expand(e.Value, env)
		case strings.Contains(fmt.Sprint(nodeKeys(e.ValueFrom)), "fieldRef"):
			env[e.Name] = "sluice-7d9c5b6f4-x2k8q"
		default:
			env[e.Name] = "token-from-" + e.Name
		}
	}
	return env
}

// setEnv gives this process the pod's environment for the check: the variables a config
// names (and the tokens') are unset, then the pod's are set.
func (pc *podCheck) setEnv(env map[string]string, names ...string) {
	for _, n := range append(names, "SLUICE_ADMIN_TOKEN", "SLUICE_METRICS_TOKEN") {
		pc.t.Setenv(n, "")
		if err := os.Unsetenv(n); err != nil {
			pc.t.Fatal(err)
		}
	}
	for k, v := range env {
		pc.t.Setenv(k, v)
	}
}

func nodeKeys(n *yaml.Node) []string {
	var ks []string
	for i := 0; i+1 < len(n.Content); i += 2 {
		ks = append(ks, n.Content[i].Value)
	}
	return ks
}

// expand replaces $(VAR) with the container's variables, as the kubelet does in command,
// args and env values; an unknown variable is left as it is.
func expand(s string, env map[string]string) string {
	return regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).ReplaceAllStringFunc(s, func(ref string) string {
		if v, ok := env[ref[2:len(ref)-1]]; ok {
			return v
		}
		return ref
	})
}

// args parses the container's command line with the real flag set of its subcommand.
func (pc *podCheck) args(env map[string]string, newFlags func(io.Writer) *flag.FlagSet) (*flag.FlagSet, bool) {
	if len(pc.c.Command) > 0 {
		pc.addf("command %q replaces the image's entrypoint (sluice): give the subcommand in args", pc.c.Command)
		return nil, false
	}
	args := make([]string, len(pc.c.Args))
	for i, a := range pc.c.Args {
		args[i] = expand(a, env)
	}
	fs := newFlags(io.Discard)
	if err := fs.Parse(args[1:]); err != nil {
		pc.addf("%s: %v", args[0], err)
		return nil, false
	}
	if fs.NArg() > 0 {
		pc.addf("%s: unexpected arguments %q", args[0], fs.Args())
		return nil, false
	}
	return fs, true
}

// servicesOf names the Services of the manifests whose ports include one of the container's.
func (pc *podCheck) servicesOf() []string {
	var names []string
	for name, ports := range pc.m.services {
		for _, p := range ports {
			for _, cp := range pc.c.Ports {
				if p == cp.ContainerPort {
					names = append(names, fmt.Sprintf("%s:%d", name, p))
				}
			}
		}
	}
	return names
}

// checkXDS checks a `sluice xds` container and returns the fleet's config it serves.
func (pc *podCheck) checkXDS() *config.Config {
	ms := pc.materialize()
	env := pc.podEnv()
	fs, ok := pc.args(env, func(w io.Writer) *flag.FlagSet { fs, _ := newXDSFlags(w); return fs })
	if !ok {
		return nil
	}
	file := fs.Lookup("config").Value.String()
	if _, _, err := net.SplitHostPort(fs.Lookup("listen").Value.String()); err != nil {
		pc.addf("--listen: %v", err)
	}
	lp, ok := pc.mountedFile(ms, "config", file)
	if !ok {
		return nil
	}
	pc.setEnv(env, pc.rewrite(ms, lp)...)
	var out, errb bytes.Buffer
	if code := run([]string{"check", "--for-replicas", lp}, &out, &errb); code != 0 {
		pc.addf("sluice check --for-replicas %s: exit %d: %s", file, code, errb.String())
		return nil
	}
	cfg, err := config.LoadFileForReplicas(lp)
	if err != nil {
		pc.addf("%v", err)
		return nil
	}
	return cfg
}

// checkServe checks a `sluice serve` container: with --config the file's config, with
// --xds/--bootstrap the bootstrap and the fleet's config the control plane serves.
func (pc *podCheck) checkServe(fleets map[string]*config.Config) {
	ms := pc.materialize()
	if len(pc.c.Args) == 0 || pc.c.Args[0] != "serve" {
		pc.addf("args %q: not `sluice serve` or `sluice xds`", pc.c.Args)
		return
	}
	var sf *serveFlags
	env := pc.podEnv()
	fs, ok := pc.args(env, func(w io.Writer) *flag.FlagSet { fs, f := newServeFlags(w); sf = f; return fs })
	if !ok {
		return
	}
	var cfg *config.Config
	switch {
	case *sf.file != "":
		lp, ok := pc.mountedFile(ms, "config", *sf.file)
		if !ok {
			return
		}
		pc.setEnv(env, pc.rewrite(ms, lp)...)
		var out, errb bytes.Buffer
		if code := run([]string{"check", lp}, &out, &errb); code != 0 {
			pc.addf("sluice check %s: exit %d: %s", *sf.file, code, strings.ReplaceAll(errb.String(), pc.root, ""))
			return
		}
		var err error
		if cfg, err = config.LoadFile(lp); err != nil {
			pc.addf("%v", err)
			return
		}
		if s := cfg.Shadow.Store; s != "" && s != ":memory:" {
			pc.writableDir(ms, "shadow.store", strings.TrimPrefix(s, pc.root))
		}
		if cfg.TLS.Enabled() && !strings.HasPrefix(cfg.TLS.CertFile, pc.root) {
			pc.addf("tls.cert_file %s: not a file of any volume the container mounts", cfg.TLS.CertFile)
		}
	case *sf.xdsAddr != "" || *sf.bootFile != "":
		cfg = pc.checkReplica(ms, env, fs, sf, fleets)
		if cfg == nil {
			return
		}
	default:
		pc.addf("serve without --config, --xds or --bootstrap")
		return
	}
	pc.checkDrain(cfg)
}

// checkReplica checks a replica's bootstrap and flags as `sluice serve --xds` takes them, and
// returns the fleet's config its control plane serves.
func (pc *podCheck) checkReplica(ms []mount, env map[string]string, fs *flag.FlagSet, sf *serveFlags, fleets map[string]*config.Config) *config.Config {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	boot := ""
	var names []string
	if *sf.bootFile != "" {
		lp, ok := pc.mountedFile(ms, "bootstrap", *sf.bootFile)
		if !ok {
			return nil
		}
		names = pc.rewrite(ms, lp)
		boot = lp
	}
	pc.setEnv(env, names...)
	persist := *sf.xdsPers
	if persist != "" {
		pc.writableDir(ms, "--xds-persist", persist)
		persist, _, _ = pc.local(ms, persist)
	}
	b, err := xdsBootstrap(boot, set, xdsFlags{server: *sf.xdsAddr, nodeID: *sf.nodeID, sotw: *sf.xdsSotW,
		persist: persist, listen: *sf.listen, admin: *sf.admin})
	if err != nil {
		pc.addf("bootstrap: %v", strings.ReplaceAll(err.Error(), pc.root, ""))
		return nil
	}
	if b.PersistPath == "" {
		pc.addf("no --xds-persist (or bootstrap persist): a replica restarted while the control plane is away serves nothing")
	}
	if b.ShadowStore != "" {
		pc.writableDir(ms, "shadow_store", strings.TrimPrefix(b.ShadowStore, pc.root))
	}
	topts := xds.TranslateOptions{Listen: b.Listen, TLS: b.ListenTLS, AdminListen: b.Admin, RouteConfig: b.RouteConfig,
		LoadSignals: b.LoadSignals, ShadowStore: b.ShadowStore}
	if _, err := xds.InitialConfig(topts); err != nil {
		pc.addf("%v", strings.ReplaceAll(err.Error(), pc.root, ""))
		return nil
	}
	fleet := fleets[b.Server]
	if fleet == nil {
		pc.addf("--xds %s: not the Service and port of a `sluice xds` control plane in the manifests", b.Server)
		return nil
	}
	// What the fleet's config leaves to each replica: its environment variables.
	have := map[string]bool{}
	for _, e := range pc.c.Env {
		have[e.Name] = true
	}
	for _, cl := range fleet.Clusters {
		if cl.APIKeyEnv != "" && !have[cl.APIKeyEnv] {
			pc.addf("the fleet's cluster %s needs %s, which the replica does not set", cl.Name, cl.APIKeyEnv)
		}
	}
	for _, tn := range fleet.Tenants {
		if tn.KeysEnv != "" && !have[tn.KeysEnv] {
			pc.addf("the fleet's tenant %s needs %s, which the replica does not set", tn.Name, tn.KeysEnv)
		}
	}
	return fleet
}

// checkDrain: the grace period covers the drain; a native sidecar is ready only while its
// model server is, and the model server outlives the requests Sluice relays.
func (pc *podCheck) checkDrain(cfg *config.Config) {
	grace := 30 * time.Second // Kubernetes' default
	if g := pc.pod.spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	drain := cfg.DrainDelay.D() + cfg.DrainTimeout.D()
	if !pc.nativeSidecar {
		if grace < drain+drainMargin {
			pc.addf("terminationGracePeriodSeconds %d is less than drain_delay (%s) + drain_timeout (%s) + %s",
				int64(grace/time.Second), cfg.DrainDelay.D(), cfg.DrainTimeout.D(), drainMargin)
		}
		return
	}
	if len(cfg.Admin.ReadyClusters) == 0 {
		pc.addf("a native sidecar without admin.ready_clusters: the pod is ready while its model server is not")
	}
	ports := map[string]bool{}
	for _, c := range pc.pod.spec.Containers {
		for _, p := range c.Ports {
			ports[strconv.Itoa(p.ContainerPort)] = true
		}
	}
	for _, name := range cfg.Admin.ReadyClusters {
		for _, cl := range cfg.Clusters {
			if cl.Name != name {
				continue
			}
			for _, e := range cl.Endpoints {
				u, err := url.Parse(e.URL)
				if err != nil || u.Hostname() != "127.0.0.1" && u.Hostname() != "localhost" || !ports[u.Port()] {
					pc.addf("ready cluster %s: endpoint %s is not a port of the pod's model server on 127.0.0.1", name, e.URL)
				}
			}
		}
	}
	for _, c := range pc.pod.spec.Containers {
		var sleep time.Duration
		if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
			sleep = time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
		}
		// The main container gets its SIGTERM first; Sluice only once it has exited. Until
		// then the pod leaves the Service and the requests in flight must finish.
		if sleep < drain {
			pc.problems = append(pc.problems, fmt.Sprintf("%s: container %s: preStop sleep %s is shorter than drain_delay (%s) + drain_timeout (%s): Sluice's requests in flight would lose their model server",
				pc.pod.name, c.Name, sleep, cfg.DrainDelay.D(), cfg.DrainTimeout.D()))
		}
		if grace < sleep+drain+drainMargin {
			pc.addf("terminationGracePeriodSeconds %d is less than the model server's preStop sleep (%s) + drain_delay (%s) + drain_timeout (%s) + %s",
				int64(grace/time.Second), sleep, cfg.DrainDelay.D(), cfg.DrainTimeout.D(), drainMargin)
		}
	}
}

// selfSigned is a certificate and key in PEM, for the TLS Secrets the user makes.
func selfSigned(t *testing.T) (cert, key string) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sluice.example"},
		DNSNames: []string{"sluice.example"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}))
}
