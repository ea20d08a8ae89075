package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lanesdev/lanes/adminapi"
)

// HistorySize is how many applied policy documents the history keeps.
const HistorySize = 20

// historyKey is the key of the document applied at revision rev:
// <prefix>policy-history/<revision, 20 digits>, so that keys sort by
// revision.
func (s *Server) historyKey(rev int64) string {
	return fmt.Sprintf("%spolicy-history/%020d", s.prefix, rev)
}

// recordPolicy keeps a document the API applied in the history and drops
// the oldest beyond HistorySize. The document is in force already: a
// failure here is logged, not returned.
func (s *Server) recordPolicy(ctx context.Context, rev int64, raw []byte, by string) {
	val, _ := json.Marshal(adminapi.PolicyRevision{Revision: rev, Raw: string(raw), Applied: s.now().UTC(), By: by})
	if _, err := s.cli.Put(ctx, s.historyKey(rev), string(val)); err != nil {
		s.log.Error("policy history: record", "revision", rev, "err", err)
		return
	}
	resp, err := s.cli.Get(ctx, s.prefix+"policy-history/", clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend))
	if err != nil {
		s.log.Warn("policy history: trim", "err", err)
		return
	}
	for i := HistorySize; i < len(resp.Kvs); i++ {
		if _, err := s.cli.Delete(ctx, string(resp.Kvs[i].Key)); err != nil {
			s.log.Warn("policy history: trim", "err", err)
			return
		}
	}
}

func (s *Server) policyHistory(w http.ResponseWriter, r *http.Request, _ *principal) error {
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	resp, err := s.cli.Get(ctx, s.prefix+"policy-history/", clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(HistorySize))
	if err != nil {
		return etcdError("read policy history", err)
	}
	out := adminapi.PolicyHistory{Revisions: []adminapi.PolicyRevision{}}
	for _, kv := range resp.Kvs {
		var pr adminapi.PolicyRevision
		if json.Unmarshal(kv.Value, &pr) == nil {
			out.Revisions = append(out.Revisions, pr)
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
