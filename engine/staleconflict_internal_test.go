package engine

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// TestStaleConflictSentAgain: an effect on a recovery's fenced paths
// refused as a conflict (10164, wrong last sequence) while the message it
// was fenced on is still its subject's last on the leader (a new leader
// behind its predecessor, seen after stepdowns: docs/architecture.md, "A
// publish a deposed leader refuses is sent again") is sent again, a copy
// under the same id and fence, and stored once, counted once; before, the
// session ended and its partition refolded. Refused so more than
// staleConflictsMax times, the session ends naming the count, as another
// writer's message ends it. The refusal is injected (EffectAnswer) for
// the subject's second effect, whose fence is the first one's sequence.
func TestStaleConflictSentAgain(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"recovery", "early"} {
		for _, refusals := range []int{2, staleConflictsMax + 1} {
			t.Run(fmt.Sprintf("%s/refused %d times", path, refusals), func(t *testing.T) {
				s, effects, journal := singleRig(t, false, "")
				r := s.p.r
				var logged storetest.SyncBuffer
				r.log = slog.New(slog.NewTextHandler(&logged, nil))
				second := store.EffectMsgID(r.key, effects[1].ID())
				stale := &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequenceConstant, Description: "wrong last sequence"}
				sends := 0
				r.cfg.Faults.EffectAnswer = func(_ int, id string) error {
					if id != second {
						return nil
					}
					sends++
					if sends <= refusals {
						return stale
					}
					return nil
				}
				var err error
				if path == "recovery" {
					for _, e := range effects {
						s.rec.deferEffect(e)
					}
					order, queues := s.rec.unpublished()
					err = s.publishFenced(t.Context(), order, queues)
				} else {
					s.early = &earlyPub{on: true, subs: map[effectKey]*earlySubject{}, effects: map[events.Kind]prometheus.Counter{}}
					for _, e := range effects {
						s.publishEarly(e)
					}
					err = s.drainEarly(t.Context())
				}
				if refusals > staleConflictsMax {
					want := fmt.Sprintf("%d times while #", refusals)
					if err == nil || !strings.Contains(err.Error(), want) {
						t.Fatalf("%s publishing after %d stale conflicts: %v, want an error saying %q", path, refusals, err, want)
					}
					checkJournal(t, s, journal(), effects[:1])
					return
				}
				if err != nil {
					t.Fatalf("%s publishing after %d stale conflicts: %v", path, refusals, err)
				}
				if sends != refusals+1 {
					t.Errorf("the second effect sent %d times, want %d", sends, refusals+1)
				}
				checkJournal(t, s, journal(), effects)
				if n := testutil.ToFloat64(r.m.Effects.WithLabelValues(string(events.KindJournal))); n != float64(len(effects)) {
					t.Errorf("meshfold_effects_published_total{kind=journal} = %v, want %d (each effect once)", n, len(effects))
				}
				if !strings.Contains(logged.String(), "refused by a stale conflict") {
					t.Errorf("no log line says why the effect was sent again:\n%s", logged.String())
				}
			})
		}
	}
}
