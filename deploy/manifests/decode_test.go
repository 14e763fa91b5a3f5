package manifests

import (
	"bytes"
	"encoding/json"
	"fmt"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
)

// kinds are the API types a manifest may hold, by apiVersion and kind. Anything else is an
// error: an object the tests cannot decode is one they cannot check.
var kinds = map[string]func() any{
	"v1/ConfigMap":                            func() any { return new(corev1.ConfigMap) },
	"v1/Secret":                               func() any { return new(corev1.Secret) },
	"v1/Service":                              func() any { return new(corev1.Service) },
	"v1/ServiceAccount":                       func() any { return new(corev1.ServiceAccount) },
	"apps/v1/Deployment":                      func() any { return new(appsv1.Deployment) },
	"autoscaling/v2/HorizontalPodAutoscaler":  func() any { return new(autoscalingv2.HorizontalPodAutoscaler) },
	"policy/v1/PodDisruptionBudget":           func() any { return new(policyv1.PodDisruptionBudget) },
	"networking.k8s.io/v1/NetworkPolicy":      func() any { return new(networkingv1.NetworkPolicy) },
	"monitoring.coreos.com/v1/ServiceMonitor": func() any { return new(monitoringv1.ServiceMonitor) },
	"monitoring.coreos.com/v1/PrometheusRule": func() any { return new(monitoringv1.PrometheusRule) },
}

// decode decodes a document strictly into its API type: an unknown field is an error, as are
// a wrong type and an unknown apiVersion/kind (a field twice is an error of Split). It is
// sigs.k8s.io/yaml's UnmarshalStrict without converting the JSON once more.
func decode(d Document) (any, error) {
	newObj, ok := kinds[d.APIVersion+"/"+d.Kind]
	if !ok {
		return nil, fmt.Errorf("%s: unknown apiVersion/kind %s/%s", d, d.APIVersion, d.Kind)
	}
	obj := newObj()
	dec := json.NewDecoder(bytes.NewReader(d.JSON))
	dec.DisallowUnknownFields()
	if err := dec.Decode(obj); err != nil {
		return nil, fmt.Errorf("%s: %w", d, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%s: data after the object", d)
	}
	return obj, nil
}
