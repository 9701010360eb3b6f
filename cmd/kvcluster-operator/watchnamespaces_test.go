package main

import (
	"slices"
	"strings"
	"testing"
)

func TestWatchNamespaces(t *testing.T) {
	for _, tc := range []struct {
		flag    string
		want    []string
		wantErr string
	}{
		{flag: "", want: nil},
		{flag: "  ", want: nil},
		{flag: "team-a", want: []string{"team-a"}},
		{flag: "team-a, team-b", want: []string{"team-a", "team-b"}},
		{flag: "team-a,,team-b", wantErr: `"" is not a namespace's name`},
		{flag: "team-a,", wantErr: `"" is not a namespace's name`},
		{flag: "Team-A", wantErr: `"Team-A" is not a namespace's name`},
		{flag: "team-a/b", wantErr: `"team-a/b" is not a namespace's name`},
		{flag: "team-a,team-a", wantErr: "namespace team-a is named twice"},
	} {
		t.Run(tc.flag, func(t *testing.T) {
			got, err := watchNamespaces(tc.flag)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("watchNamespaces(%q) = %q, %v; want an error with %q", tc.flag, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("watchNamespaces(%q) = %q, %v; want %q", tc.flag, got, err, tc.want)
			}
		})
	}
}
