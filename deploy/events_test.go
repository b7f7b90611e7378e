package deploy

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	rbacv1 "k8s.io/api/rbac/v1"
)

// The ClusterRoles the manifests and the chart ship, by name.
const (
	draRole    = "nri-gpu-dra"
	eventsRole = "nri-gpu-events"
)

// roles are objs's ClusterRoles named name.
func roles(objs objects, name string) []*rbacv1.ClusterRole {
	var out []*rbacv1.ClusterRole
	for _, r := range objs.clusterRoles {
		if r.Name == name {
			out = append(out, r)
		}
	}
	return out
}

// bindings are objs's ClusterRoleBindings to the ClusterRole name.
func bindings(objs objects, name string) []*rbacv1.ClusterRoleBinding {
	var out []*rbacv1.ClusterRoleBinding
	for _, b := range objs.bindings {
		if b.RoleRef.Name == name {
			out = append(out, b)
		}
	}
	return out
}

// TestEventsShipped: deploy/kubernetes and the chart's defaults turn the
// pods' Events on, with the least RBAC (create and patch Events in the
// core group, nothing else), bound to nri-gpu's account, whose token is
// mounted, and NODE_NAME for the Events' source; the two render the same
// RBAC. The chart with config.events.enabled: false renders no role and,
// with the DRA driver off too, mounts no token.
func TestEventsShipped(t *testing.T) {
	plain, _ := loadKubernetes(t)
	chart, _ := renderHelm(t, nil)
	for name, objs := range map[string]objects{"deploy/kubernetes": plain, "helm": chart} {
		if !parseShipped(t, objs).Events.On() {
			t.Errorf("%s: events off", name)
		}
		rs, bs := roles(objs, eventsRole), bindings(objs, eventsRole)
		if len(rs) != 1 || len(bs) != 1 {
			t.Fatalf("%s: %d roles %s, %d bindings", name, len(rs), eventsRole, len(bs))
		}
		want := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}}}
		if diff := cmp.Diff(want, rs[0].Rules); diff != "" {
			t.Errorf("%s: rules (-want +got):\n%s", name, diff)
		}
		if s := bs[0].Subjects; len(s) != 1 || s[0].Kind != "ServiceAccount" || s[0].Name != objs.serviceAccount.Name || s[0].Namespace != "nri-gpu" {
			t.Errorf("%s: binding subjects %+v", name, s)
		}
		spec := objs.daemonSet.Spec.Template.Spec
		if !*spec.AutomountServiceAccountToken || !*objs.serviceAccount.AutomountServiceAccountToken {
			t.Errorf("%s: no service account token with events on", name)
		}
		found := false
		for _, e := range spec.Containers[0].Env {
			found = found || e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
		}
		if !found {
			t.Errorf("%s: no NODE_NAME from spec.nodeName", name)
		}
	}
	if diff := cmp.Diff(roles(plain, eventsRole), roles(chart, eventsRole), withoutHelmMetadata()); diff != "" {
		t.Errorf("ClusterRole: deploy/kubernetes vs chart:\n%s", diff)
	}
	if diff := cmp.Diff(bindings(plain, eventsRole), bindings(chart, eventsRole), withoutHelmMetadata()); diff != "" {
		t.Errorf("ClusterRoleBinding: deploy/kubernetes vs chart:\n%s", diff)
	}

	off, _ := renderHelm(t, func(v map[string]any) {
		v["config"].(map[string]any)["events"].(map[string]any)["enabled"] = false
	})
	checkDaemonSet(t, off)
	if parseShipped(t, off).Events.On() || len(off.clusterRoles)+len(off.bindings) != 0 || *off.daemonSet.Spec.Template.Spec.AutomountServiceAccountToken {
		t.Errorf("events off: events %v, %d roles, token %v", parseShipped(t, off).Events.On(), len(off.clusterRoles), *off.daemonSet.Spec.Template.Spec.AutomountServiceAccountToken)
	}
}
