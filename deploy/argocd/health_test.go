// Package argocd tests health.lua with gopher-lua, the Lua interpreter Argo CD runs health
// scripts in, on KVCluster objects in each state the operator publishes.
package argocd

import (
	"os"
	"testing"

	lua "github.com/yuin/gopher-lua"
)

func TestHealthScript(t *testing.T) {
	script, err := os.ReadFile("health.lua")
	if err != nil {
		t.Fatal(err)
	}
	cond := func(typ, status, msg string) map[string]any {
		return map[string]any{"type": typ, "status": status, "message": msg}
	}
	tests := []struct {
		name       string
		generation int
		status     map[string]any
		deleting   bool
		want       string
	}{
		{"no status yet", 1, nil, false, "Progressing"},
		{"operator has not seen the new spec", 2, map[string]any{"observedGeneration": 1, "phase": "Ready",
			"conditions": []any{cond("Ready", "True", "3/3 members ready")}}, false, "Progressing"},
		{"creating", 1, map[string]any{"observedGeneration": 1, "phase": "Creating",
			"conditions": []any{cond("Ready", "False", "1/3 members ready"), cond("Reconciling", "True", "1/3")}}, false, "Progressing"},
		{"ready", 1, map[string]any{"observedGeneration": 1, "phase": "Ready",
			"conditions": []any{cond("Ready", "True", "3/3 members ready; etcd is healthy")}}, false, "Healthy"},
		{"formed but a member is down", 1, map[string]any{"observedGeneration": 1, "phase": "Ready",
			"conditions": []any{cond("Ready", "False", "2/3 members ready")}}, false, "Degraded"},
		{"failed", 1, map[string]any{"observedGeneration": 1, "phase": "Failed",
			"conditions": []any{cond("Ready", "False", "x"), cond("Stalled", "True", "etcd has had no quorum")}}, false, "Degraded"},
		{"being deleted (final backup)", 1, map[string]any{"observedGeneration": 1, "phase": "Ready",
			"conditions": []any{cond("Ready", "True", "ok")}}, true, "Progressing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obj := map[string]any{
				"apiVersion": "kvcluster.io/v1alpha1", "kind": "KVCluster",
				"metadata": map[string]any{"name": "kv", "generation": tt.generation},
			}
			if tt.deleting {
				obj["metadata"].(map[string]any)["deletionTimestamp"] = "2026-11-30T00:00:00Z"
			}
			if tt.status != nil {
				obj["status"] = tt.status
			}
			L := lua.NewState()
			defer L.Close()
			L.SetGlobal("obj", toLua(L, obj))
			if err := L.DoString(string(script)); err != nil {
				t.Fatal(err)
			}
			hs, ok := L.Get(-1).(*lua.LTable)
			if !ok {
				t.Fatalf("the script returned %v, not a table", L.Get(-1))
			}
			if got := hs.RawGetString("status").String(); got != tt.want {
				t.Errorf("health = %s (%s), want %s", got, hs.RawGetString("message"), tt.want)
			}
			if hs.RawGetString("message") == lua.LNil {
				t.Error("no message")
			}
		})
	}
}

// toLua converts a JSON-like value as Argo CD does: objects and arrays become tables.
func toLua(L *lua.LState, v any) lua.LValue {
	switch v := v.(type) {
	case map[string]any:
		t := L.NewTable()
		for k, e := range v {
			t.RawSetString(k, toLua(L, e))
		}
		return t
	case []any:
		t := L.NewTable()
		for _, e := range v {
			t.Append(toLua(L, e))
		}
		return t
	case string:
		return lua.LString(v)
	case int:
		return lua.LNumber(v)
	case bool:
		return lua.LBool(v)
	}
	return lua.LNil
}

// FuzzHealthScript runs the script on KVClusters of any phase, generations and conditions (in
// the shape the API publishes: every condition has a type, a status and a message, maybe empty):
// it never fails, always answers a health Argo CD knows with a message, and says Healthy only
// for a cluster whose operator saw its latest spec, reports it Ready and nothing Stalled.
func FuzzHealthScript(f *testing.F) {
	script, err := os.ReadFile("health.lua")
	if err != nil {
		f.Fatal(err)
	}
	f.Add("Ready", uint8(1), uint8(1), []byte{0, 1}, "3/3 members ready", false)
	f.Add("Failed", uint8(2), uint8(2), []byte{0, 0, 1, 1}, "", false)
	f.Add("Creating", uint8(3), uint8(2), []byte{}, "x", true)
	f.Fuzz(func(t *testing.T, phase string, generation, observed uint8, conditions []byte, message string, deleting bool) {
		types := []string{"Ready", "Stalled", "Reconciling", "SpaceLow", ""}
		statuses := []string{"True", "False", "Unknown"}
		var conds []any
		healthy, stalled := false, false
		for i := 0; i+1 < len(conditions) && i < 20; i += 2 {
			typ, status := types[int(conditions[i])%len(types)], statuses[int(conditions[i+1])%len(statuses)]
			conds = append(conds, map[string]any{"type": typ, "status": status, "message": message})
			stalled = stalled || typ == "Stalled" && status == "True"
			if typ == "Ready" {
				healthy = status == "True" // the script reads the last Ready condition
			}
		}
		obj := map[string]any{
			"apiVersion": "kvcluster.io/v1alpha1", "kind": "KVCluster",
			"metadata": map[string]any{"name": "kv", "generation": int(generation)},
			"status":   map[string]any{"observedGeneration": int(observed), "phase": phase, "conditions": conds},
		}
		if deleting {
			obj["metadata"].(map[string]any)["deletionTimestamp"] = "2026-11-30T00:00:00Z"
		}
		L := lua.NewState()
		defer L.Close()
		L.SetGlobal("obj", toLua(L, obj))
		if err := L.DoString(string(script)); err != nil {
			t.Fatalf("the script failed on %v: %v", obj, err)
		}
		hs, ok := L.Get(-1).(*lua.LTable)
		if !ok {
			t.Fatalf("the script returned %v, not a table", L.Get(-1))
		}
		status := hs.RawGetString("status").String()
		if status != "Healthy" && status != "Progressing" && status != "Degraded" {
			t.Errorf("health %q on %v", status, obj)
		}
		if _, ok := hs.RawGetString("message").(lua.LString); !ok {
			t.Errorf("message %v on %v", hs.RawGetString("message"), obj)
		}
		if want := healthy && !stalled && !deleting && observed >= generation; (status == "Healthy") != want {
			t.Errorf("health %s on %v; Healthy expected: %t", status, obj, want)
		}
	})
}
