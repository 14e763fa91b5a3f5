package xds

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// The resource types the client subscribes to, in the order it asks for them.
const (
	typeCluster  = resource.ClusterType
	typeEndpoint = resource.EndpointType
	typeRoute    = resource.RouteType
	typePolicy   = resource.ExtensionConfigType
)

var clientTypes = []string{typeCluster, typeEndpoint, typeRoute, typePolicy}

// shortType is the type's name in metrics, logs and Status.
func shortType(typeURL string) string {
	switch typeURL {
	case typeCluster:
		return "cds"
	case typeEndpoint:
		return "eds"
	case typeRoute:
		return "rds"
	case typePolicy:
		return "ecds"
	}
	return typeURL
}

// entry is one accepted resource.
type entry struct {
	version string
	raw     *anypb.Any
	msg     proto.Message
}

// store holds every accepted resource by type and name, and the version of each type (the
// state-of-the-world version_info, or delta's system_version_info). It is never edited once
// shared: updates build a new one.
type store struct {
	types    map[string]map[string]entry
	versions map[string]string
	seen     map[string]bool // a response of the type was accepted
}

func newStore() *store {
	s := &store{types: map[string]map[string]entry{}, versions: map[string]string{}, seen: map[string]bool{}}
	for _, t := range clientTypes {
		s.types[t] = map[string]entry{}
	}
	return s
}

// update is one response, decoded.
type update struct {
	typeURL string
	upserts map[string]entry
	removed []string
	full    bool // the response is the whole set of its type (state-of-the-world CDS)
	version string
	nonce   string
	// problems found while decoding; a response with problems is rejected whole.
	problems []string
	// hash identifies the content, to recognise the same rejected content sent again.
	hash string
}

// with returns a copy of s with u applied; endpoints no cluster asks for are dropped.
func (s *store) with(u *update) *store {
	n := &store{types: make(map[string]map[string]entry, len(s.types)), versions: maps.Clone(s.versions), seen: maps.Clone(s.seen)}
	n.seen[u.typeURL] = true
	for t, m := range s.types {
		n.types[t] = m // shared until written
	}
	m := map[string]entry{}
	if !u.full {
		m = maps.Clone(s.types[u.typeURL])
	}
	for _, name := range u.removed {
		delete(m, name)
	}
	maps.Copy(m, u.upserts)
	n.types[u.typeURL] = m
	if u.version != "" {
		n.versions[u.typeURL] = u.version
	}
	n.pruneEndpoints()
	return n
}

// pruneEndpoints drops the assignments of clusters that are gone or no longer use EDS.
func (s *store) pruneEndpoints() {
	want := map[string]bool{}
	for _, n := range s.edsNames() {
		want[n] = true
	}
	eps := s.types[typeEndpoint]
	for name := range eps {
		if !want[name] {
			eps = maps.Clone(eps)
			for name := range eps {
				if !want[name] {
					delete(eps, name)
				}
			}
			s.types[typeEndpoint] = eps
			return
		}
	}
}

// edsNames are the service names of the clusters whose endpoints come over EDS, sorted.
func (s *store) edsNames() []string {
	var names []string
	for name, e := range s.types[typeCluster] {
		if n, ok := edsServiceName(name, e.msg.(*clusterv3.Cluster)); ok {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return slices.Compact(names)
}

// edsServiceName is the ClusterLoadAssignment name of an EDS cluster.
func edsServiceName(name string, c *clusterv3.Cluster) (string, bool) {
	if c.GetType() != clusterv3.Cluster_EDS {
		return "", false
	}
	if sn := c.GetEdsClusterConfig().GetServiceName(); sn != "" {
		return sn, true
	}
	return name, true
}

// missing lists what a complete config still waits for: a first CDS response, the
// assignments of EDS clusters and the bootstrap's route configuration.
func (s *store) missing(routeConfig string) []string {
	var out []string
	if !s.seen[typeCluster] {
		out = append(out, "cds")
	}
	for _, n := range s.edsNames() {
		if _, ok := s.types[typeEndpoint][n]; !ok {
			out = append(out, "eds:"+n)
		}
	}
	if _, ok := s.types[typeRoute][routeConfig]; !ok {
		out = append(out, "rds:"+routeConfig)
	}
	return out
}

// resources is the set in the form Translate takes.
func (s *store) resources() Resources {
	r := Resources{
		Clusters:  map[string]*clusterv3.Cluster{},
		Endpoints: map[string]*endpointv3.ClusterLoadAssignment{},
		Routes:    map[string]*routev3.RouteConfiguration{},
	}
	for n, e := range s.types[typeCluster] {
		r.Clusters[n] = e.msg.(*clusterv3.Cluster)
	}
	for n, e := range s.types[typeEndpoint] {
		r.Endpoints[n] = e.msg.(*endpointv3.ClusterLoadAssignment)
	}
	for n, e := range s.types[typeRoute] {
		r.Routes[n] = e.msg.(*routev3.RouteConfiguration)
	}
	if e, ok := s.types[typePolicy][PolicyName]; ok {
		r.Policy = e.msg.(*corev3.TypedExtensionConfig)
	}
	return r
}

// resourceVersions is name → version of one type (delta's initial_resource_versions).
func (s *store) resourceVersions(typeURL string) map[string]string {
	out := make(map[string]string, len(s.types[typeURL]))
	for n, e := range s.types[typeURL] {
		out[n] = e.version
	}
	return out
}

// validator is what every Envoy message generated with protoc-gen-validate has.
type validator interface{ ValidateAll() error }

// decodeResource unmarshals and validates one resource of typeURL. name is the name the
// response gave it (delta), or "" (state-of-the-world: the name is the message's).
func decodeResource(typeURL, name string, a *anypb.Any) (proto.Message, string, []string) {
	label := fmt.Sprintf("%s %q", shortType(typeURL), name)
	if a == nil {
		return nil, name, []string{label + ": resource without a body"}
	}
	if a.GetTypeUrl() != typeURL {
		return nil, name, []string{fmt.Sprintf("%s: type %s in a %s response", label, a.GetTypeUrl(), typeURL)}
	}
	var msg proto.Message
	switch typeURL {
	case typeCluster:
		msg = &clusterv3.Cluster{}
	case typeEndpoint:
		msg = &endpointv3.ClusterLoadAssignment{}
	case typeRoute:
		msg = &routev3.RouteConfiguration{}
	case typePolicy:
		msg = &corev3.TypedExtensionConfig{}
	default:
		return nil, name, []string{fmt.Sprintf("%s: type not subscribed", label)}
	}
	if err := a.UnmarshalTo(msg); err != nil {
		return nil, name, []string{fmt.Sprintf("%s: decode: %v", label, err)}
	}
	own := messageName(msg)
	if name == "" {
		name = own
		label = fmt.Sprintf("%s %q", shortType(typeURL), name)
	}
	var problems []string
	if own != name {
		problems = append(problems, fmt.Sprintf("%s: the resource is named %q inside", label, own))
	}
	if name == "" {
		problems = append(problems, label+": resource without a name")
	}
	if v, ok := msg.(validator); ok {
		if err := v.ValidateAll(); err != nil {
			var multi interface{ AllErrors() []error }
			if errors.As(err, &multi) {
				for _, e := range multi.AllErrors() {
					problems = append(problems, fmt.Sprintf("%s: %v", label, e))
				}
			} else {
				problems = append(problems, fmt.Sprintf("%s: %v", label, err))
			}
		}
	}
	return msg, name, problems
}

func messageName(m proto.Message) string {
	switch m := m.(type) {
	case *clusterv3.Cluster:
		return m.GetName()
	case *endpointv3.ClusterLoadAssignment:
		return m.GetClusterName()
	case *routev3.RouteConfiguration:
		return m.GetName()
	case *corev3.TypedExtensionConfig:
		return m.GetName()
	}
	return ""
}

// hashContent identifies a response's content (names, bodies, removals) whatever its nonce
// and version, to recognise the same rejected content sent again.
func hashContent(typeURL string, items map[string]*anypb.Any, removed []string) string {
	h := sha256.New()
	put := func(b []byte) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	put([]byte(typeURL))
	names := slices.Sorted(maps.Keys(items))
	for _, n := range names {
		put([]byte(n))
		put([]byte(items[n].GetTypeUrl()))
		put(items[n].GetValue())
	}
	rm := slices.Clone(removed)
	sort.Strings(rm)
	put([]byte("removed"))
	for _, n := range rm {
		put([]byte(n))
	}
	return hex.EncodeToString(h.Sum(nil)[:12])
}

// persistFormat names the layout of the persisted file.
const persistFormat = "sluice-xds-resources/v1"

// persisted is the file PersistPath holds: the resources of the last good config, each as
// its type, name, version and serialized body (protobuf, base64 in JSON), so that no type
// registry is needed to read it back.
type persisted struct {
	Format        string             `json:"format"`
	SavedAt       time.Time          `json:"saved_at"`
	NodeID        string             `json:"node_id"`
	ConfigVersion string             `json:"config_version"`
	TypeVersions  map[string]string  `json:"type_versions,omitempty"`
	Resources     []persistedMessage `json:"resources"`
}

type persistedMessage struct {
	Type    string `json:"type"`
	Name    string `json:"name"`
	Version string `json:"version,omitempty"`
	Value   []byte `json:"value"`
}

// save writes the store to path atomically (a temporary file renamed over it).
func (s *store) save(path, nodeID, configVersion string) error {
	p := persisted{Format: persistFormat, SavedAt: time.Now().UTC(), NodeID: nodeID, ConfigVersion: configVersion, TypeVersions: s.versions}
	for _, t := range clientTypes {
		for _, n := range slices.Sorted(maps.Keys(s.types[t])) {
			e := s.types[t][n]
			p.Resources = append(p.Resources, persistedMessage{Type: t, Name: n, Version: e.version, Value: e.raw.GetValue()})
		}
	}
	data, err := json.MarshalIndent(p, "", " ")
	if err != nil {
		return fmt.Errorf("encode: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("create temporary file: %w", err)
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("sync %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("rename into %s: %w", path, err)
	}
	return nil
}

// loadStore reads a persisted file back, decoding and validating every resource.
func loadStore(path string) (*store, *persisted, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var p persisted
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, nil, fmt.Errorf("decode %s: %w", path, err)
	}
	if p.Format != persistFormat {
		return nil, nil, fmt.Errorf("%s: format %q, want %q", path, p.Format, persistFormat)
	}
	s := newStore()
	var problems []string
	for _, r := range p.Resources {
		if _, ok := s.types[r.Type]; !ok {
			problems = append(problems, fmt.Sprintf("%s %q: unknown type", r.Type, r.Name))
			continue
		}
		a := &anypb.Any{TypeUrl: r.Type, Value: r.Value}
		msg, name, probs := decodeResource(r.Type, r.Name, a)
		if len(probs) > 0 {
			problems = append(problems, probs...)
			continue
		}
		s.types[r.Type][name] = entry{version: r.Version, raw: a, msg: msg}
	}
	if len(problems) > 0 {
		return nil, nil, fmt.Errorf("%s: %d bad resources: %v", path, len(problems), problems)
	}
	maps.Copy(s.versions, p.TypeVersions)
	for _, t := range clientTypes {
		s.seen[t] = true
	}
	return s, &p, nil
}
