package manifests

import (
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"slices"
	"sort"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// sluiceImage matches the images of Sluice (the static build and the NVML one).
var sluiceImage = regexp.MustCompile(`(^|/)sluice(-gpu)?(:|@|$)`)

// objects are the decoded documents of one rendered file.
type objects struct {
	deployments     []*appsv1.Deployment
	services        []*corev1.Service
	configMaps      map[string]*corev1.ConfigMap
	secrets         map[string]*corev1.Secret
	serviceAccounts map[string]*corev1.ServiceAccount
	hpas            []*autoscalingv2.HorizontalPodAutoscaler
	pdbs            []*policyv1.PodDisruptionBudget
	netpols         []*networkingv1.NetworkPolicy
	monitors        []*monitoringv1.ServiceMonitor
	rules           []*monitoringv1.PrometheusRule
}

// problems collects what a check finds.
type problems []string

func (p *problems) addf(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

// checkManifests decodes every document of a rendered file strictly and checks what would
// break in a cluster: selectors that select nothing, ports and volumes that do not exist,
// references to objects that are neither in the file nor in provided (the objects the user
// makes, "Secret/sluice-tls"), containers that could run as root or write their root file
// system. It returns every problem found.
func checkManifests(data []byte, provided map[string]bool) problems {
	var p problems
	docs, err := Split(data)
	if err != nil {
		p.addf("%v", err)
		return p
	}
	o := objects{configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{},
		serviceAccounts: map[string]*corev1.ServiceAccount{}}
	names := map[string]bool{}
	for _, d := range docs {
		obj, err := decode(d)
		if err != nil {
			p.addf("%v", err)
			continue
		}
		if key := d.Kind + "/" + d.Name; names[key] {
			p.addf("%s: a second %s", d, key)
		} else {
			names[key] = true
		}
		switch v := obj.(type) {
		case *appsv1.Deployment:
			o.deployments = append(o.deployments, v)
		case *corev1.Service:
			o.services = append(o.services, v)
		case *corev1.ConfigMap:
			o.configMaps[v.Name] = v
		case *corev1.Secret:
			o.secrets[v.Name] = v
		case *corev1.ServiceAccount:
			o.serviceAccounts[v.Name] = v
		case *autoscalingv2.HorizontalPodAutoscaler:
			o.hpas = append(o.hpas, v)
		case *policyv1.PodDisruptionBudget:
			o.pdbs = append(o.pdbs, v)
		case *networkingv1.NetworkPolicy:
			o.netpols = append(o.netpols, v)
		case *monitoringv1.ServiceMonitor:
			o.monitors = append(o.monitors, v)
		case *monitoringv1.PrometheusRule:
			o.rules = append(o.rules, v)
		}
		checkMeta(&p, d)
	}
	for _, dep := range o.deployments {
		checkDeployment(&p, &o, dep, provided)
	}
	checkServices(&p, &o)
	checkScaling(&p, &o)
	checkNetworkPolicies(&p, &o)
	checkMonitoring(&p, &o, provided)
	checkConfigMaps(&p, &o)
	for _, sa := range o.serviceAccounts {
		if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
			p.addf("ServiceAccount %s: automountServiceAccountToken is not false", sa.Name)
		}
	}
	return p
}

// checkMeta checks the names and labels the API server would refuse, and that no namespace is
// set (the plain manifests apply to the namespace kubectl is given) but on dashboards.
func checkMeta(p *problems, d Document) {
	var m struct {
		Metadata struct {
			Name      string            `json:"name"`
			Namespace string            `json:"namespace"`
			Labels    map[string]string `json:"labels"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(d.JSON, &m); err != nil {
		p.addf("%s: %v", d, err)
		return
	}
	isName := validation.IsDNS1123Subdomain
	if d.Kind == "Service" {
		isName = validation.IsDNS1035Label
	}
	for _, e := range isName(m.Metadata.Name) {
		p.addf("%s: name %q: %s", d, m.Metadata.Name, e)
	}
	// Dashboards may go where Grafana's sidecar looks (dashboards.namespace).
	if dashboard := d.Kind == "ConfigMap" && m.Metadata.Labels["grafana_dashboard"] != ""; m.Metadata.Namespace != "" && !dashboard {
		p.addf("%s: namespace %q is set: the manifests must apply to any namespace", d, m.Metadata.Namespace)
	}
	for _, e := range metav1validation.ValidateLabels(m.Metadata.Labels, field.NewPath("metadata", "labels")) {
		p.addf("%s: %v", d, e)
	}
}

// selects reports whether a selector's labels all hold in labels (an empty selector selects
// nothing here: the chart never means "every pod").
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// podContainers are the containers of a pod that run alongside the others: the regular ones
// and the native sidecars (init containers with restartPolicy Always).
func podContainers(spec *corev1.PodSpec) []corev1.Container {
	var cs []corev1.Container
	for _, c := range spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			cs = append(cs, c)
		}
	}
	return append(cs, spec.Containers...)
}

// allContainers adds the init containers that run to completion before the others.
func allContainers(spec *corev1.PodSpec) []corev1.Container {
	return append(slices.Clone(spec.InitContainers), spec.Containers...)
}

// containerPort finds the container of a pod serving a Service's or policy's port, by name
// or number.
func containerPort(spec *corev1.PodSpec, port intstr.IntOrString) (corev1.Container, bool) {
	for _, c := range podContainers(spec) {
		for _, cp := range c.Ports {
			if port.Type == intstr.String && cp.Name == port.StrVal || port.Type == intstr.Int && cp.ContainerPort == port.IntVal {
				return c, true
			}
		}
	}
	return corev1.Container{}, false
}

func checkDeployment(p *problems, o *objects, dep *appsv1.Deployment, provided map[string]bool) {
	at := "Deployment " + dep.Name
	tmpl := dep.Spec.Template
	if dep.Spec.Selector == nil || !selects(dep.Spec.Selector.MatchLabels, tmpl.Labels) || len(dep.Spec.Selector.MatchExpressions) > 0 {
		p.addf("%s: spec.selector does not select the pod template's labels %v", at, tmpl.Labels)
	}
	spec := &tmpl.Spec
	if sa := spec.ServiceAccountName; sa != "" && sa != "default" && o.serviceAccounts[sa] == nil && !provided["ServiceAccount/"+sa] {
		p.addf("%s: serviceAccountName %q: no such ServiceAccount", at, sa)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		p.addf("%s: automountServiceAccountToken is not false (Sluice never calls the Kubernetes API)", at)
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		if _, dup := volumes[v.Name]; dup {
			p.addf("%s: volume %q twice", at, v.Name)
		}
		volumes[v.Name] = v
		checkVolume(p, o, at, v, provided)
	}
	used := map[string]bool{}
	portNames := map[string]string{}
	containerNames := map[string]bool{}
	for _, c := range allContainers(spec) {
		cat := fmt.Sprintf("%s: container %s", at, c.Name)
		for _, e := range validation.IsDNS1123Label(c.Name) {
			p.addf("%s: name: %s", cat, e)
		}
		if containerNames[c.Name] {
			p.addf("%s: a second container of that name", cat)
		}
		containerNames[c.Name] = true
		for _, cp := range c.Ports {
			if cp.Name == "" {
				continue
			}
			for _, e := range validation.IsValidPortName(cp.Name) {
				p.addf("%s: port name %q: %s", cat, cp.Name, e)
			}
			if other, dup := portNames[cp.Name]; dup {
				p.addf("%s: port name %q already names a port of %s", cat, cp.Name, other)
			}
			portNames[cp.Name] = c.Name
		}
		for what, pr := range map[string]*corev1.Probe{"startupProbe": c.StartupProbe, "livenessProbe": c.LivenessProbe, "readinessProbe": c.ReadinessProbe} {
			checkProbePort(p, cat+": "+what, pr, c)
		}
		if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
			if h := c.Lifecycle.PreStop; h.Exec == nil && h.HTTPGet == nil && h.TCPSocket == nil && h.Sleep == nil {
				p.addf("%s: preStop has no handler", cat)
			}
		}
		checkEnv(p, o, cat, c, provided)
		writable := false
		for _, m := range c.VolumeMounts {
			v, ok := volumes[m.Name]
			if !ok {
				p.addf("%s: volumeMount %q: no such volume", cat, m.Name)
				continue
			}
			used[m.Name] = true
			if m.MountPath == "/tmp" && !m.ReadOnly && v.EmptyDir != nil {
				writable = true
			}
		}
		if !writable {
			p.addf("%s: no writable emptyDir at /tmp (the root file system is read-only)", cat)
		}
		checkSecurity(p, cat, spec.SecurityContext, c.SecurityContext)
		checkResources(p, cat, c.Resources)
	}
	for name := range volumes {
		if !used[name] {
			p.addf("%s: volume %q is mounted by no container", at, name)
		}
	}
	if spec.SecurityContext == nil || spec.SecurityContext.SeccompProfile == nil {
		p.addf("%s: the pod sets no seccompProfile", at)
	}
}

func checkProbePort(p *problems, at string, pr *corev1.Probe, c corev1.Container) {
	if pr == nil {
		if !strings.HasSuffix(at, "startupProbe") {
			p.addf("%s: missing", at)
		}
		return
	}
	var port *intstr.IntOrString
	switch {
	case pr.HTTPGet != nil:
		port = &pr.HTTPGet.Port
	case pr.TCPSocket != nil:
		port = &pr.TCPSocket.Port
	case pr.GRPC != nil:
		port = &intstr.IntOrString{Type: intstr.Int, IntVal: pr.GRPC.Port}
	default:
		p.addf("%s: no handler", at)
		return
	}
	for _, cp := range c.Ports {
		if port.Type == intstr.String && cp.Name == port.StrVal || port.Type == intstr.Int && cp.ContainerPort == port.IntVal {
			return
		}
	}
	p.addf("%s: port %s is not a port of the container", at, port.String())
}

// checkVolume checks that what a volume names exists in the render or is made by the user.
func checkVolume(p *problems, o *objects, at string, v corev1.Volume, provided map[string]bool) {
	switch {
	case v.ConfigMap != nil:
		cm := o.configMaps[v.ConfigMap.Name]
		switch {
		case cm == nil && !provided["ConfigMap/"+v.ConfigMap.Name] && !ptrTrue(v.ConfigMap.Optional):
			p.addf("%s: volume %q: ConfigMap %s is neither in the manifests nor made by the user", at, v.Name, v.ConfigMap.Name)
		case cm != nil:
			for _, it := range v.ConfigMap.Items {
				if _, ok := cm.Data[it.Key]; !ok {
					p.addf("%s: volume %q: ConfigMap %s has no key %q", at, v.Name, cm.Name, it.Key)
				}
			}
		}
	case v.Secret != nil:
		if o.secrets[v.Secret.SecretName] == nil && !provided["Secret/"+v.Secret.SecretName] && !ptrTrue(v.Secret.Optional) {
			p.addf("%s: volume %q: Secret %s is neither in the manifests nor made by the user", at, v.Name, v.Secret.SecretName)
		}
	case v.PersistentVolumeClaim != nil:
		if !provided["PersistentVolumeClaim/"+v.PersistentVolumeClaim.ClaimName] {
			p.addf("%s: volume %q: PersistentVolumeClaim %s is not made by the user", at, v.Name, v.PersistentVolumeClaim.ClaimName)
		}
	case v.EmptyDir != nil:
		if v.EmptyDir.SizeLimit == nil {
			p.addf("%s: emptyDir %q has no sizeLimit", at, v.Name)
		}
	case v.Ephemeral != nil:
		t := v.Ephemeral.VolumeClaimTemplate
		if t == nil || len(t.Spec.AccessModes) == 0 || t.Spec.Resources.Requests.Storage().IsZero() {
			p.addf("%s: ephemeral volume %q has no access mode or size", at, v.Name)
		}
	default:
		p.addf("%s: volume %q: a kind of volume the tests do not know", at, v.Name)
	}
}

func ptrTrue(b *bool) bool { return b != nil && *b }

func checkEnv(p *problems, o *objects, at string, c corev1.Container, provided map[string]bool) {
	seen := map[string]bool{}
	for _, e := range c.Env {
		for _, msg := range validation.IsEnvVarName(e.Name) {
			p.addf("%s: env %q: %s", at, e.Name, msg)
		}
		if seen[e.Name] {
			p.addf("%s: env %q twice", at, e.Name)
		}
		seen[e.Name] = true
		if e.ValueFrom == nil {
			continue
		}
		switch r := e.ValueFrom; {
		case r.SecretKeyRef != nil:
			s := o.secrets[r.SecretKeyRef.Name]
			switch {
			case s != nil:
				_, inData := s.Data[r.SecretKeyRef.Key]
				_, inString := s.StringData[r.SecretKeyRef.Key]
				if !inData && !inString {
					p.addf("%s: env %s: Secret %s has no key %q", at, e.Name, s.Name, r.SecretKeyRef.Key)
				}
			case !provided["Secret/"+r.SecretKeyRef.Name] && !ptrTrue(r.SecretKeyRef.Optional):
				p.addf("%s: env %s: Secret %s is neither in the manifests nor made by the user", at, e.Name, r.SecretKeyRef.Name)
			}
		case r.ConfigMapKeyRef != nil:
			cm := o.configMaps[r.ConfigMapKeyRef.Name]
			switch {
			case cm != nil:
				if _, ok := cm.Data[r.ConfigMapKeyRef.Key]; !ok {
					p.addf("%s: env %s: ConfigMap %s has no key %q", at, e.Name, cm.Name, r.ConfigMapKeyRef.Key)
				}
			case !provided["ConfigMap/"+r.ConfigMapKeyRef.Name] && !ptrTrue(r.ConfigMapKeyRef.Optional):
				p.addf("%s: env %s: ConfigMap %s is neither in the manifests nor made by the user", at, e.Name, r.ConfigMapKeyRef.Name)
			}
		case r.FieldRef != nil:
			if !slices.Contains([]string{"metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName",
				"spec.serviceAccountName", "status.podIP", "status.hostIP"}, r.FieldRef.FieldPath) {
				p.addf("%s: env %s: fieldRef %q is not a field the downward API gives to env", at, e.Name, r.FieldRef.FieldPath)
			}
		}
	}
}

// checkSecurity checks the container's effective security context (the container's fields
// over the pod's): non-root, read-only root file system, no privilege escalation, every
// capability dropped, the runtime's seccomp profile.
func checkSecurity(p *problems, at string, pod *corev1.PodSecurityContext, c *corev1.SecurityContext) {
	if pod == nil {
		pod = &corev1.PodSecurityContext{}
	}
	if c == nil {
		p.addf("%s: no securityContext", at)
		return
	}
	nonRoot := c.RunAsNonRoot
	if nonRoot == nil {
		nonRoot = pod.RunAsNonRoot
	}
	user := c.RunAsUser
	if user == nil {
		user = pod.RunAsUser
	}
	switch {
	case !ptrTrue(nonRoot):
		p.addf("%s: runAsNonRoot is not true", at)
	case user == nil || *user == 0:
		p.addf("%s: runAsUser is not set to a non-root user (the image decides)", at)
	}
	if !ptrTrue(c.ReadOnlyRootFilesystem) {
		p.addf("%s: readOnlyRootFilesystem is not true", at)
	}
	if c.AllowPrivilegeEscalation == nil || *c.AllowPrivilegeEscalation {
		p.addf("%s: allowPrivilegeEscalation is not false", at)
	}
	if ptrTrue(c.Privileged) {
		p.addf("%s: privileged", at)
	}
	if c.Capabilities == nil || !slices.Contains(c.Capabilities.Drop, "ALL") || len(c.Capabilities.Add) > 0 {
		p.addf("%s: capabilities: not drop [ALL] with nothing added", at)
	}
	sp := c.SeccompProfile
	if sp == nil {
		sp = pod.SeccompProfile
	}
	if sp == nil || sp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		p.addf("%s: seccompProfile is not RuntimeDefault", at)
	}
}

func checkResources(p *problems, at string, r corev1.ResourceRequirements) {
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if q, ok := r.Requests[name]; !ok || q.IsZero() {
			p.addf("%s: no %s request", at, name)
		}
	}
	if q, ok := r.Limits[corev1.ResourceMemory]; !ok || q.IsZero() {
		p.addf("%s: no memory limit", at)
	}
	for name, req := range r.Requests {
		if lim, ok := r.Limits[name]; ok && req.Cmp(lim) > 0 {
			p.addf("%s: %s request %s is above its limit %s", at, name, req.String(), lim.String())
		}
	}
}

// checkServices: each Service selects pods of the render, and each of its ports reaches a
// port of a container running Sluice (in a sidecar pod: Sluice's, never the model server's).
func checkServices(p *problems, o *objects) {
	for _, s := range o.services {
		at := "Service " + s.Name
		var pods []*appsv1.Deployment
		for _, d := range o.deployments {
			if selects(s.Spec.Selector, d.Spec.Template.Labels) {
				pods = append(pods, d)
			}
		}
		if len(pods) == 0 {
			p.addf("%s: selector %v selects no pod template", at, s.Spec.Selector)
			continue
		}
		for _, sp := range s.Spec.Ports {
			for _, e := range validation.IsValidPortName(sp.Name) {
				p.addf("%s: port name %q: %s", at, sp.Name, e)
			}
			target := sp.TargetPort
			if target.Type == intstr.Int && target.IntVal == 0 {
				target = intstr.FromInt32(sp.Port)
			}
			for _, d := range pods {
				c, ok := containerPort(&d.Spec.Template.Spec, target)
				switch {
				case !ok:
					p.addf("%s: port %s: targetPort %s is not a container port of Deployment %s", at, sp.Name, target.String(), d.Name)
				case !sluiceImage.MatchString(c.Image):
					p.addf("%s: port %s: targetPort %s is container %s's (%s), not Sluice's", at, sp.Name, target.String(), c.Name, c.Image)
				}
			}
		}
	}
}

// checkScaling: the autoscaler and disruption budget act on a Deployment of the render.
func checkScaling(p *problems, o *objects) {
	deployment := func(name string) *appsv1.Deployment {
		for _, d := range o.deployments {
			if d.Name == name {
				return d
			}
		}
		return nil
	}
	for _, h := range o.hpas {
		at := "HorizontalPodAutoscaler " + h.Name
		ref := h.Spec.ScaleTargetRef
		d := deployment(ref.Name)
		switch {
		case ref.Kind != "Deployment" || ref.APIVersion != "apps/v1" || d == nil:
			p.addf("%s: scaleTargetRef %s %s (%s) is not a Deployment of the manifests", at, ref.Kind, ref.Name, ref.APIVersion)
		case d.Spec.Replicas != nil:
			p.addf("%s: Deployment %s sets replicas: every apply would undo the autoscaler", at, d.Name)
		}
		if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas < 1 || *h.Spec.MinReplicas > h.Spec.MaxReplicas {
			p.addf("%s: minReplicas must be within 1..maxReplicas (%d)", at, h.Spec.MaxReplicas)
		}
		if len(h.Spec.Metrics) == 0 {
			p.addf("%s: no metrics", at)
		}
		for _, m := range h.Spec.Metrics {
			if m.Type == autoscalingv2.PodsMetricSourceType && (m.Pods == nil || m.Pods.Metric.Name == "" ||
				m.Pods.Target.Type != autoscalingv2.AverageValueMetricType || m.Pods.Target.AverageValue == nil) {
				p.addf("%s: a Pods metric needs a name and an AverageValue target", at)
			}
		}
	}
	for _, b := range o.pdbs {
		at := "PodDisruptionBudget " + b.Name
		var sel map[string]string
		if b.Spec.Selector != nil {
			sel = b.Spec.Selector.MatchLabels
		}
		var matched []*appsv1.Deployment
		for _, d := range o.deployments {
			if selects(sel, d.Spec.Template.Labels) {
				matched = append(matched, d)
			}
		}
		if len(matched) == 0 {
			p.addf("%s: selector %v selects no pod template", at, sel)
			continue
		}
		if b.Spec.MinAvailable == nil && b.Spec.MaxUnavailable == nil {
			p.addf("%s: neither minAvailable nor maxUnavailable", at)
		}
		if mu := b.Spec.MaxUnavailable; mu != nil && mu.Type == intstr.Int && mu.IntVal < 1 {
			p.addf("%s: maxUnavailable %d blocks every node drain", at, mu.IntVal)
		}
		for _, d := range matched {
			if ma := b.Spec.MinAvailable; ma != nil && ma.Type == intstr.Int && d.Spec.Replicas != nil && ma.IntVal >= *d.Spec.Replicas {
				p.addf("%s: minAvailable %d of %d replicas of %s blocks every node drain", at, ma.IntVal, *d.Spec.Replicas, d.Name)
			}
		}
	}
}

// checkNetworkPolicies: each policy selects pods of the render, and its named ports are ports
// of the pods they apply to.
func checkNetworkPolicies(p *problems, o *objects) {
	podsOf := func(sel map[string]string) []*appsv1.Deployment {
		var ds []*appsv1.Deployment
		for _, d := range o.deployments {
			if selects(sel, d.Spec.Template.Labels) {
				ds = append(ds, d)
			}
		}
		return ds
	}
	namedPort := func(at string, ds []*appsv1.Deployment, port *intstr.IntOrString) {
		if port == nil || port.Type != intstr.String {
			return
		}
		for _, d := range ds {
			if _, ok := containerPort(&d.Spec.Template.Spec, *port); !ok {
				p.addf("%s: port %q is not a container port of Deployment %s", at, port.StrVal, d.Name)
			}
		}
	}
	for _, np := range o.netpols {
		at := "NetworkPolicy " + np.Name
		own := podsOf(np.Spec.PodSelector.MatchLabels)
		if len(own) == 0 {
			p.addf("%s: podSelector %v selects no pod template", at, np.Spec.PodSelector.MatchLabels)
			continue
		}
		for i, r := range np.Spec.Ingress {
			for _, port := range r.Ports {
				namedPort(fmt.Sprintf("%s: ingress[%d]", at, i), own, port.Port)
			}
		}
		hasEgress := slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress)
		if len(np.Spec.Egress) > 0 && !hasEgress {
			p.addf("%s: egress rules without the Egress policy type", at)
		}
		for i, r := range np.Spec.Egress {
			for _, peer := range r.To {
				if peer.PodSelector == nil || peer.NamespaceSelector != nil {
					continue
				}
				if to := podsOf(peer.PodSelector.MatchLabels); len(to) > 0 {
					for _, port := range r.Ports {
						namedPort(fmt.Sprintf("%s: egress[%d]", at, i), to, port.Port)
					}
				}
			}
		}
	}
}

// checkMonitoring: the ServiceMonitor scrapes a port of a Service of the render with a
// credential that exists; the rules are there.
func checkMonitoring(p *problems, o *objects, provided map[string]bool) {
	for _, sm := range o.monitors {
		at := "ServiceMonitor " + sm.Name
		var svcs []*corev1.Service
		for _, s := range o.services {
			if selects(sm.Spec.Selector.MatchLabels, s.Labels) {
				svcs = append(svcs, s)
			}
		}
		if len(svcs) == 0 {
			p.addf("%s: selector %v selects no Service", at, sm.Spec.Selector.MatchLabels)
			continue
		}
		for _, s := range svcs {
			if sm.Spec.JobLabel != "" && s.Labels[sm.Spec.JobLabel] == "" {
				p.addf("%s: jobLabel %s is not a label of Service %s", at, sm.Spec.JobLabel, s.Name)
			}
		}
		if len(sm.Spec.Endpoints) == 0 {
			p.addf("%s: no endpoints", at)
		}
		for i, ep := range sm.Spec.Endpoints {
			for _, s := range svcs {
				if !slices.ContainsFunc(s.Spec.Ports, func(sp corev1.ServicePort) bool { return sp.Name == ep.Port }) {
					p.addf("%s: endpoints[%d].port %q is not a port of Service %s", at, i, ep.Port, s.Name)
				}
			}
			if a := ep.Authorization; a != nil && a.Credentials != nil {
				name, key := a.Credentials.Name, a.Credentials.Key
				s := o.secrets[name]
				switch {
				case s != nil:
					if _, ok := s.Data[key]; !ok {
						p.addf("%s: endpoints[%d]: Secret %s has no key %q", at, i, name, key)
					}
				case !provided["Secret/"+name]:
					p.addf("%s: endpoints[%d]: Secret %s is neither in the manifests nor made by the user", at, i, name)
				}
			}
		}
	}
	for _, r := range o.rules {
		if len(r.Spec.Groups) == 0 {
			p.addf("PrometheusRule %s: no groups", r.Name)
		}
		for _, g := range r.Spec.Groups {
			for j, rule := range g.Rules {
				if (rule.Alert == "") == (rule.Record == "") || rule.Expr.String() == "" {
					p.addf("PrometheusRule %s: group %s rule %d: needs an expr and one of alert or record", r.Name, g.Name, j)
				}
			}
		}
	}
}

// checkConfigMaps: valid keys, dashboards that are JSON, and no ConfigMap that nothing uses.
func checkConfigMaps(p *problems, o *objects) {
	mounted := map[string]bool{}
	for _, d := range o.deployments {
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.ConfigMap != nil {
				mounted[v.ConfigMap.Name] = true
			}
		}
		for _, c := range allContainers(&d.Spec.Template.Spec) {
			for _, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil {
					mounted[e.ValueFrom.ConfigMapKeyRef.Name] = true
				}
			}
		}
	}
	var names []string
	for name := range o.configMaps {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		cm := o.configMaps[name]
		at := "ConfigMap " + name
		dashboard := cm.Labels["grafana_dashboard"] != ""
		if !mounted[name] && !dashboard {
			p.addf("%s: used by no pod", at)
		}
		for key, v := range cm.Data {
			for _, e := range validation.IsConfigMapKey(key) {
				p.addf("%s: key %q: %s", at, key, e)
			}
			if path.Ext(key) == ".json" && !json.Valid([]byte(v)) {
				p.addf("%s: %s is not valid JSON", at, key)
			}
		}
		if dashboard && len(cm.Data) == 0 {
			p.addf("%s: a dashboard ConfigMap without a dashboard", at)
		}
	}
}
