// What deploy/grafana/fairness.json must be, in Grafana's own published types (@grafana/schema): the classic
// dashboard JSON model (`Dashboard`), each panel's `options` and `fieldConfig.defaults.custom` checked against its
// plugin's own panel-config types. tests/test_dashboard.py writes the dashboard as an object literal of type
// `FairnessDashboard` and runs `tsc --noEmit --strict` on it: literal values are checked against the schema's enums
// and unions, and excess-property checks refuse any key the schema does not know.
//
// Options and custom field config may leave keys out (Grafana fills each plugin's defaults when it loads a
// panel), so they are checked as deep partials: every key given must exist and have the schema's type.
import type { Dashboard, FieldConfig, FieldConfigSource, Panel, RowPanel } from '@grafana/schema';
import type * as BarGauge from '@grafana/schema/dist/esm/raw/composable/bargauge/panelcfg/x/BarGaugePanelCfg_types.gen';
import type * as Stat from '@grafana/schema/dist/esm/raw/composable/stat/panelcfg/x/StatPanelCfg_types.gen';
import type * as StateTimeline from '@grafana/schema/dist/esm/raw/composable/statetimeline/panelcfg/x/StateTimelinePanelCfg_types.gen';
import type * as Table from '@grafana/schema/dist/esm/raw/composable/table/panelcfg/x/TablePanelCfg_types.gen';
import type * as TimeSeries from '@grafana/schema/dist/esm/raw/composable/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen';

/** A type as JSON writes it: a string enum of the schema (`ThresholdsMode.Absolute`) as its values (`"absolute"`). */
type Json<T> = T extends string
  ? `${T}`
  : T extends ReadonlyArray<infer U>
    ? Array<Json<U>>
    : T extends object
      ? { [K in keyof T]: Json<T[K]> }
      : T;

type DeepPartial<T> = T extends string
  ? `${T}`
  : T extends ReadonlyArray<infer U>
    ? Array<DeepPartial<U>>
    : T extends object
      ? { [K in keyof T]?: DeepPartial<T[K]> }
      : T;

/** A panel of one plugin: Grafana's Panel, with that plugin's options and custom field config. */
type PluginPanel<Type extends string, Options, Custom> = Json<Omit<Panel, 'type' | 'options' | 'fieldConfig'>> & {
  type: Type;
  options?: DeepPartial<Options>;
  fieldConfig?: Json<Omit<FieldConfigSource, 'defaults'>> & {
    defaults: Json<Omit<FieldConfig, 'custom'>> & { custom?: DeepPartial<Custom> };
  };
};

type NoCustom = Record<string, never>;

export type FairnessPanel =
  | PluginPanel<'bargauge', BarGauge.Options, NoCustom>
  | PluginPanel<'stat', Stat.Options, NoCustom>
  | PluginPanel<'state-timeline', StateTimeline.Options, StateTimeline.FieldConfig>
  | PluginPanel<'table', Table.Options, Table.FieldConfig>
  | PluginPanel<'timeseries', TimeSeries.Options, TimeSeries.FieldConfig>;

/** A row holds no panels of its own while it is expanded (`collapsed: false`): they follow it at the top level. */
type FairnessRow = Json<Omit<RowPanel, 'panels'>> & { panels: FairnessPanel[] };

export type FairnessDashboard = Json<Omit<Dashboard, 'panels'>> & { panels: Array<FairnessPanel | FairnessRow> };
